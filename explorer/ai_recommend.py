"""AI recommendations through Amazon Bedrock: opt-in, off by default, one bounded request per ask.

The real Neuron Explorer's AI Recommendation (``neuron-explorer recommend``, the Summary's "Get AI
Recommendation" widget) sends a profile to Claude Sonnet 4.5 on Amazon Bedrock with the user's default
AWS credentials (US Regions only) and shows the top 2-3 optimisations: the symptom with its numbers, the
change, the expected speedup and the tradeoffs, as Markdown. Ours does the same with what the Summary
already shows: the ``traces`` figures (``data.summary``), the NKI coverage and throttling
(``data.insights``), the top ops and source lines, and the deterministic findings the Summary ranks
(``recommend.recommendations``, passed in), computed once and sent as text of at most ``MAX_PROMPT_CHARS``.
Nothing is contacted unless the user asks (``neuron-explorer recommend --ai-recommendation``, or
``neuron-explorer view --ai-recommendation`` and the Summary's button); every call has a connect/read
timeout, bounded retries and ``MAX_TOKENS`` of answer, and every failure is one line (``Answer.error``).
boto3 is imported only when a request is made.

>>> cfg = settings(region="us-west-2")
>>> cfg["model"], cfg["region"], cfg["max_tokens"]
('us.anthropic.claude-sonnet-4-5-20250929-v1:0', 'us-west-2', 2000)
>>> settings(region="eu-west-1")
Traceback (most recent call last):
...
ValueError: --ai-region eu-west-1: AI recommendations run in US Regions only (as the real tool's); give e.g. us-east-1
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from explorer import data
from traces.timefmt import fmt_ns

#: The only model the real tool supports (Claude Sonnet 4.5), as Bedrock's US cross-Region inference
#: profile: the real tool runs in US Regions only and may process a request in another US Region.
DEFAULT_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
#: Used when neither ``--ai-region`` nor the AWS configuration names a US Region.
DEFAULT_REGION = "us-east-1"
#: Answer bound. The real tool allows up to 10,000 output tokens per request; ours asks for at most
#: ~600 words, so 2,000 tokens is room enough and keeps the bill small.
MAX_TOKENS = 2000
#: The prompt's bound (~5k tokens; the real tool sends up to 30,000 input tokens).
MAX_PROMPT_CHARS = 20_000
#: The longest answer shown (a model that ignores MAX_TOKENS cannot flood the page).
MAX_ANSWER_CHARS = 20_000
#: Bedrock can take up to a minute for this answer (the real tool's docs); past that the ask fails.
CONNECT_TIMEOUT_S, READ_TIMEOUT_S, MAX_ATTEMPTS = 10, 90, 2
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:/_-]{0,255}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")

SYSTEM = (
    "You are a performance engineer for AWS Trainium and Inferentia (NeuronCore) workloads. You are given the "
    "Summary of one profile and the findings of the profiler's deterministic rules. Give the top 2-3 optimization "
    "opportunities, ranked by impact and then effort. For each, under its own heading: **Symptom** (quantified "
    "with the profile's numbers), **Optimization** (what to change and how), **Expected speedup** (an estimate, "
    "with its assumption) and **Tradeoffs**. Use only the numbers given; add to the rules' findings rather than "
    "repeating them, and say so when the data cannot support a recommendation. Answer in Markdown, under 600 words.")

SETTINGS: dict = {"enabled": False}
"""The Summary's button: set by ``neuron-explorer view --ai-recommendation`` (``settings()`` plus ``enabled``)."""


@dataclass
class Answer:
    """What the model said (``text``, Markdown) or why it could not (``error``, one line)."""
    model: str
    region: str
    text: str = ""
    error: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    truncated: bool = False


def settings(model: str | None = None, region: str | None = None) -> dict:
    """The model and region an ask uses: given, else the AWS configuration's US Region, else us-east-1.

    A malformed model id or a non-US region is a ValueError naming the flag and the fix.
    """
    model = model or DEFAULT_MODEL
    if not _MODEL_ID.match(model):
        raise ValueError(f"--ai-model {model[:80]!r}: not a Bedrock model id; give e.g. {DEFAULT_MODEL}")
    if region is not None:
        if not _REGION.match(region) or not region.startswith("us-"):
            raise ValueError(f"--ai-region {region[:40]}: AI recommendations run in US Regions only (as the real "
                             f"tool's); give e.g. {DEFAULT_REGION}")
    else:
        configured = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or _config_region()
        region = configured if configured and configured.startswith("us-") else DEFAULT_REGION
    return {"model": model, "region": region, "max_tokens": MAX_TOKENS}


def _config_region() -> str | None:
    """The region of the AWS profile in use (``~/.aws/config``), read without contacting anything."""
    try:
        import botocore.session

        return botocore.session.Session(profile=os.environ.get("AWS_PROFILE") or None).get_config_variable("region")
    except Exception:  # noqa: BLE001 - a broken config is reported by the ask itself
        return None


# ------------------------------------------------------------------------------ the prompt
def _clip(text, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def prompt(L: data.Loaded, findings: list) -> str:
    """The text sent: the Summary's figures, insights, top ops and lines, and ``findings`` (the rules'
    ``recommend.Finding`` list, as the Summary ranks it), bounded.

    Example: ``prompt(L, recommend.recommendations(L))`` starts "Profile of a simulated NeuronCore workload".
    """
    s, ins, hot = data.summary(L), data.insights(L), data.top_lines(L, 10)
    lines = [
        "Profile of a simulated NeuronCore workload (neuron_stack; is_simulation=true: device times come from a "
        "per-instruction cost model of the target, host times were measured).",
        "", "## Summary figures",
        f"- target: {s['device_profile']} ({s['instance_type']}), {s['cores']} NeuronCore(s), timing model "
        f"{s['timing_model'] or 'n/a'}, auto-cast {s['auto_cast'] or 'n/a'}",
        f"- on-device time: {fmt_ns(s['device_ns'])} over {s['executions']} executions "
        f"({s['warmup_executions']} warm-up); step time {fmt_ns(s['step_ns'])}",
        f"- device busy: {s['device_busy_percent']:.1f}% of {fmt_ns(s['span_ns'])} between first and last execution",
        f"- MFU (estimated): {s['mfu_estimated_percent']:.2f}% ({s['model_flops'] / 1e9:.3g} GFLOP model, "
        f"{s['hardware_flops'] / 1e9:.3g} GFLOP hardware, {s['transpose_flops'] / 1e9:.3g} GFLOP transposes)",
        f"- HBM read {s['hbm_read_bytes']:,} B, write {s['hbm_write_bytes']:,} B; MBU (estimated) "
        f"{s['mbu_estimated_percent']:.2f}%; useful reads {s['useful_read_percent']:.0f}%; SBUF spill save "
        f"{s['spill_save_bytes']:,} B, reload {s['spill_reload_bytes']:,} B",
        f"- CPU fallbacks: {s['fallback_ops']} ops, {s['fallback_calls']} calls, {fmt_ns(s['cpu_fallback_ns'])} host",
        f"- graphs {s['graphs']}, compiles {s['compiles']}, recompiles {s['recompiles']}, "
        f"{fmt_ns(s['compile_wall_ns'])} compiling; {s['instructions']:,} instructions",
        "- engine active (% of device time): " + ", ".join(f"{e} {v:.1f}%" for e, v in s["engines"].items()),
        "- Tensor Engine FLOPs (% of peak): " + ", ".join(f"{k} {v:.1f}%" for k, v in s["flops_breakdown"].items()),
        "- memory bandwidth (% of available): " + ", ".join(f"{k} {v:.1f}%"
                                                            for k, v in s["bandwidth_breakdown"].items()),
        "- NKI coverage (instructions): " + (", ".join(f"{e} {c['nki_percent']:.0f}%"
                                                        for e, c in ins["nki_coverage"].items()) or "n/a"),
        f"- throttling: {ins['throttling']['throttle_events']} Tensor Engine ramps, active throttled "
        f"{ins['throttling']['active_throttled_percent']:.2f}% of peak FLOPs",
        "", "## Top ops by device time",
        *(f"- {_clip(r['op'], 80)} in {_clip(r['module'] or '-', 60)} at {_clip(r['where'], 80)}: "
          f"{fmt_ns(r['device_ns'])}, {r['instructions']} instructions, engines "
          + ", ".join(f"{e} {fmt_ns(v)}" for e, v in r["engines"].items()) for r in data.top_ops(L, 10)),
        "", "## Top source lines by device time",
        *(f"- {_clip(r['where'], 80)} `{_clip(r['code'], 120)}`: {fmt_ns(r['device_ns'])} device, "
          f"{fmt_ns(r['host_ns'])} host" for r in hot),
        "", "## The profiler's rule-based findings (costliest first)",
        *(f"{i}. {f.title} (~{fmt_ns(f.impact_ns)}): {_clip(f.words, 700)}"
          for i, f in enumerate(findings, start=1)),
        # last, so the bound cuts the source before any figure or finding
        *_excerpts(L, hot),
    ]
    text = "\n".join(lines)
    return text if len(text) <= MAX_PROMPT_CHARS else text[: MAX_PROMPT_CHARS - 12] + "\n[truncated]"


def _excerpts(L: data.Loaded, hot: list[dict], context: int = 6, files: int = 3,
              per_file: int = 3000) -> list[str]:
    """The source around the hottest lines (the real tool reads the kernel's source too): ``context`` lines
    each side, numbered, from the text the profile embeds (or the file under ``--nki-source-root``)."""
    wanted: dict[str, list[int]] = {}
    for r in hot:
        if r.get("file") and r.get("line"):
            wanted.setdefault(r["file"], []).append(r["line"])
    out = []
    for file, hot_lines in list(wanted.items())[:files]:
        try:
            src = data.source_text(L, file)[0].splitlines()
        except data.ExplorerError:   # a line whose file the profile does not embed
            continue
        keep = sorted({i for n in hot_lines for i in range(max(n - context, 1), min(n + context, len(src)) + 1)})
        body, prev = [], 0
        for i in keep:
            if prev and i != prev + 1:
                body.append("   …")
            body.append(f"{i:5d}  {src[i - 1][:160]}")
            prev = i
        if body:
            out += ["", f"## Source: {file.rsplit('/', 1)[-1][:80]} (around its hottest lines)", "```python",
                    _cap("\n".join(body), per_file), "```"]
    return out


def _cap(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 2] + "\n…"


# ------------------------------------------------------------------------------ the request
def client(region: str):
    """A ``bedrock-runtime`` client with the user's default AWS credentials (``AWS_PROFILE`` honoured)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(profile_name=os.environ.get("AWS_PROFILE") or None)
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"})
    return session.client("bedrock-runtime", region_name=region, config=config)


def ask(text: str, model: str, region: str, max_tokens: int = MAX_TOKENS, bedrock=None) -> Answer:
    """One Converse request; never raises for AWS's failures (``Answer.error`` says what and the fix).

    ``bedrock`` is a ``bedrock-runtime`` client (tests pass a stubbed one); by default one is made.
    """
    answer = Answer(model, region)
    try:
        bedrock = bedrock or client(region)
        resp = bedrock.converse(modelId=model, system=[{"text": SYSTEM}],
                                messages=[{"role": "user", "content": [{"text": text}]}],
                                inferenceConfig={"maxTokens": max_tokens, "temperature": 0.2})
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line on the page / stderr
        answer.error = error_line(exc, model, region)
        return answer
    blocks = resp.get("output", {}).get("message", {}).get("content", [])
    answer.text = "\n".join(b["text"] for b in blocks if "text" in b).strip()[:MAX_ANSWER_CHARS]
    answer.input_tokens = resp.get("usage", {}).get("inputTokens", 0)
    answer.output_tokens = resp.get("usage", {}).get("outputTokens", 0)
    answer.truncated = resp.get("stopReason") == "max_tokens"
    if not answer.text:
        answer.error = f"{model} returned no text (stop reason {resp.get('stopReason', '?')}): try again"
    return answer


def error_line(exc: BaseException, model: str, region: str) -> str:
    """One line naming the failure and its fix (never a credential).

    >>> from botocore.exceptions import NoCredentialsError
    >>> error_line(NoCredentialsError(), "m", "us-east-1")[:38]
    'no AWS credentials found: configure th'
    """
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
        ReadTimeoutError,
    )

    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return ("no AWS credentials found: configure them (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY) with bedrock:InvokeModel permission")
    if isinstance(exc, ProfileNotFound):
        return f"AWS profile {os.environ.get('AWS_PROFILE', '')!r} not found: fix AWS_PROFILE or ~/.aws/config"
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
        return (f"Amazon Bedrock did not answer within {READ_TIMEOUT_S} s ({region}): try again, or another "
                "US Region with --ai-region")
    if isinstance(exc, EndpointConnectionError):
        return f"cannot reach Amazon Bedrock in {region}: check the network (and any proxy)"
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        msg = _clip(exc.response.get("Error", {}).get("Message", ""), 160)
        fix = {
            "AccessDeniedException": f"no access to {model} in {region}: grant bedrock:InvokeModel and enable the "
                                     "model in the Bedrock console's Model access page",
            "ThrottlingException": "throttled by Amazon Bedrock (request rate or token quota): wait a minute and "
                                   "try again",
            "ServiceQuotaExceededException": "over the Bedrock quota for this model: wait, or raise the quota",
            "ModelTimeoutException": f"{model} took too long: try again",
            "ResourceNotFoundException": f"model {model} not found in {region}: check --ai-model and --ai-region",
            "ValidationException": f"Amazon Bedrock refused the request for {model} in {region}",
            "UnrecognizedClientException": "the AWS credentials are not valid: refresh them (aws sso login, "
                                           "aws configure)",
            "ExpiredTokenException": "the AWS session token has expired: refresh the credentials",
        }.get(code, f"Amazon Bedrock error {code}")
        return f"{fix} ({code}{': ' + msg if msg else ''})"
    return f"Amazon Bedrock request failed: {type(exc).__name__}: {_clip(exc, 160)}"


def recommend_ai(L: data.Loaded, findings: list, model: str, region: str, max_tokens: int = MAX_TOKENS,
                 bedrock=None) -> Answer:
    """Ask the model about one profile. Example: ``recommend_ai(L, recommend.recommendations(L), **settings())``."""
    return ask(prompt(L, findings), model, region, max_tokens, bedrock)


def label(a: Answer) -> str:
    """The line above the model's answer, so no one takes it for the rules' output.

    >>> label(Answer("m", "us-east-1", "x", input_tokens=10, output_tokens=5))
    'AI-generated by m via Amazon Bedrock (us-east-1, 10 tokens in, 5 out): verify before acting on it'
    """
    cut = ", cut at the token limit" if a.truncated else ""
    return (f"AI-generated by {a.model} via Amazon Bedrock ({a.region}, {a.input_tokens} tokens in, "
            f"{a.output_tokens} out{cut}): verify before acting on it")
