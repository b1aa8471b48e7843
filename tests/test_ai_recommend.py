"""AI recommendations through Amazon Bedrock (explorer/ai_recommend.py), with no network.

The ``bedrock-runtime`` client is real boto3 under botocore's ``Stubber``: the request's shape is
checked against what we mean to send (the model, the bounded prompt built from the Summary's own
figures and the rules' findings, the token bound), and each failure AWS can return becomes one line
while the rule-based recommendations still show. A ``before-send`` hook fails any test that would
reach the network. Driven as a user does: ``neuron-explorer recommend --ai-recommendation`` and the
Summary's button through Dash's own callback route.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
from botocore.stub import Stubber
from plotly.utils import PlotlyJSONEncoder
from test_explorer_profiles import make_profile

from explorer import ai_recommend, cli, data, recommend
from explorer.app import create_app
from explorer.pages import summary

ANSWER = "## 1. Keep the weights resident\n**Symptom:** fc2 is DMA-bound (141 µs of DMA)."
REPLY = {"output": {"message": {"role": "assistant", "content": [{"text": ANSWER}]}}, "stopReason": "end_turn",
         "usage": {"inputTokens": 1234, "outputTokens": 56, "totalTokens": 1290}, "metrics": {"latencyMs": 900}}
REAL_CLIENT = ai_recommend.client   # the tests swap ai_recommend.client for a stubbed one


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return make_profile(tmp_path_factory.mktemp("ai") / "20260101_mlp")


@pytest.fixture(scope="module")
def app(profile):
    app = create_app([profile])
    yield app
    data.registry().close()


@pytest.fixture
def aws(monkeypatch):
    """Fake credentials, no config files, no instance metadata: nothing here can find a real account."""
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
              "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def offline_client(region="us-east-1", fail=None):
    """A real bedrock-runtime client whose sends fail the test (or raise ``fail``, a transport error)."""
    c = REAL_CLIENT(region)

    def no_network(request, **_):
        if fail is not None:
            raise fail
        raise AssertionError(f"a test reached the network: {request.url}")
    c.meta.events.register("before-send", no_network)
    return c


def stubbed(monkeypatch, reply=REPLY, error=None, expected=None):
    """``ai_recommend.client`` returns a stubbed client answering ``reply`` (or the AWS ``error`` code)."""
    c = offline_client()
    stub = Stubber(c)
    if error:
        stub.add_client_error("converse", service_error_code=error[0], service_message=error[2],
                              http_status_code=error[1])
    else:
        stub.add_response("converse", reply, expected)
    stub.activate()
    made = []
    monkeypatch.setattr(ai_recommend, "client", lambda region: made.append(region) or c)
    return stub, made


def loaded(profile):
    reg = data.registry()
    return reg.get(reg.keys()[0])


def test_the_request_is_the_bounded_summary_for_the_real_model(app, profile, aws, monkeypatch):
    L = loaded(profile)
    text = ai_recommend.prompt(L, recommend.recommendations(L))
    s = data.summary(L)
    # the figures and findings the Summary shows, computed by the same functions
    assert f"MFU (estimated): {s['mfu_estimated_percent']:.2f}%" in text
    assert f"{s['executions']} executions" in text
    for f in recommend.recommendations(L):
        assert f.title in text
    hottest = data.top_lines(L, 1)[0]   # the code around the hottest line, numbered, as the real tool reads it
    assert f"{hottest['line']:5d}  {hottest['code']}" in text.split("## Source: model.py")[1]
    assert len(text) <= ai_recommend.MAX_PROMPT_CHARS
    cfg = ai_recommend.settings()
    assert cfg["model"].endswith("anthropic.claude-sonnet-4-5-20250929-v1:0") and cfg["region"] == "us-east-1"
    expected = {"modelId": cfg["model"], "system": [{"text": ai_recommend.SYSTEM}],
                "messages": [{"role": "user", "content": [{"text": text}]}],
                "inferenceConfig": {"maxTokens": ai_recommend.MAX_TOKENS, "temperature": 0.2}}
    stub, made = stubbed(monkeypatch, expected=expected)
    a = ai_recommend.recommend_ai(L, recommend.recommendations(L), **cfg)
    stub.assert_no_pending_responses()
    assert made == ["us-east-1"] and a.error == "" and a.text == ANSWER
    assert (a.input_tokens, a.output_tokens, a.truncated) == (1234, 56, False)
    assert "AI-generated by" in ai_recommend.label(a) and "verify" in ai_recommend.label(a)


def test_the_prompt_is_cut_at_its_bound(app, profile, monkeypatch):
    monkeypatch.setattr(ai_recommend, "MAX_PROMPT_CHARS", 500)
    L = loaded(profile)
    text = ai_recommend.prompt(L, recommend.recommendations(L))
    assert len(text) <= 500 and text.endswith("[truncated]")


@pytest.mark.parametrize("code,status,words", [
    ("AccessDeniedException", 403, "no access to"),
    ("ThrottlingException", 429, "throttled"),
    ("ResourceNotFoundException", 404, "not found in us-east-1"),
    ("ValidationException", 400, "refused the request"),
    ("ServiceUnavailableException", 503, "Amazon Bedrock error ServiceUnavailableException"),
])
def test_each_aws_error_is_one_line(app, profile, aws, monkeypatch, code, status, words):
    stubbed(monkeypatch, error=(code, status, "You don't have access\nto the model."))
    L = loaded(profile)
    a = ai_recommend.recommend_ai(L, recommend.recommendations(L), **ai_recommend.settings())
    assert words in a.error and code in a.error and "\n" not in a.error and a.text == ""


@pytest.mark.parametrize("exc,words", [
    (ReadTimeoutError(endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com"), "did not answer within"),
    (ConnectTimeoutError(endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com"), "did not answer within"),
])
def test_a_timeout_is_one_line(aws, exc, words):
    a = ai_recommend.ask("hello", ai_recommend.DEFAULT_MODEL, "us-east-1", bedrock=offline_client(fail=exc))
    assert words in a.error and "\n" not in a.error


def test_no_credentials_is_one_line(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    a = ai_recommend.ask("hello", ai_recommend.DEFAULT_MODEL, "us-east-1", bedrock=offline_client())
    assert a.error.startswith("no AWS credentials found") and "\n" not in a.error


def test_settings_refuse_a_bad_model_or_a_non_us_region(aws, monkeypatch):
    with pytest.raises(ValueError, match="US Regions only"):
        ai_recommend.settings(region="eu-west-1")
    with pytest.raises(ValueError, match="not a Bedrock model id"):
        ai_recommend.settings(model="claude; rm -rf /")
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert ai_recommend.settings()["region"] == "us-west-2"
    monkeypatch.setenv("AWS_REGION", "eu-central-1")   # configured outside the US: the default US Region
    assert ai_recommend.settings()["region"] == "us-east-1"


# ------------------------------------------------------------------------------ the command line
def test_cli_prints_the_rules_then_the_models_answer(profile, aws, monkeypatch, capsys):
    stubbed(monkeypatch)
    assert cli.main(["recommend", str(profile), "--ai-recommendation"]) == 0
    out = capsys.readouterr().out
    assert out.index("1. ") < out.index("AI recommendation (AI-generated by") < out.index(ANSWER)

    stubbed(monkeypatch)
    assert cli.main(["recommend", str(profile), "--ai-recommendation", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recommendations"] and doc["ai_recommendation"]["text"] == ANSWER
    assert doc["ai_recommendation"]["model"] == ai_recommend.DEFAULT_MODEL


def test_cli_error_is_one_line_and_the_rules_still_print(profile, aws, monkeypatch, capsys):
    stubbed(monkeypatch, error=("ThrottlingException", 429, "Too many requests"))
    assert cli.main(["recommend", str(profile), "--ai-recommendation"]) == 1
    out, err = capsys.readouterr()
    assert "evidence:" in out
    assert err.count("\n") == 1 and err.startswith("neuron-explorer: error: AI recommendation: throttled")


def test_cli_contacts_nothing_unless_asked(profile, monkeypatch, capsys):
    def refuse(region):
        raise AssertionError("a client was made without --ai-recommendation")
    monkeypatch.setattr(ai_recommend, "client", refuse)
    assert cli.main(["recommend", str(profile)]) == 0
    assert "AI recommendation" not in capsys.readouterr().out
    assert cli.main(["recommend", str(profile), "--print-prompt"]) == 0
    assert capsys.readouterr().out.startswith("Profile of a simulated NeuronCore workload")
    assert cli.main(["recommend", str(profile), "--ai-recommendation", "--ai-region", "eu-west-1"]) == 1
    assert "US Regions only" in capsys.readouterr().err
    assert cli.main(["recommend", str(profile), "--print-prompt", "--nki-source-root", "/nonexistent/src"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nki-source-root /nonexistent/src: no such directory" in err


def test_nothing_imports_boto3_until_asked():
    code = ("import sys, explorer.app, explorer.pages.summary, explorer.ai_recommend, explorer.cli\n"
            "explorer.cli.build_parser()\nprint('boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------ the Summary page
def rendered(key) -> str:
    """The Summary page for ``key`` as the JSON Dash sends the browser."""
    return json.dumps(summary.layout(profile=key), cls=PlotlyJSONEncoder)


def click(app, key):
    """The Summary's Get AI recommendation button, through Dash's callback route as the browser sends it."""
    body = {"output": "summary-ai.children", "outputs": {"id": "summary-ai", "property": "children"},
            "inputs": [{"id": "summary-ai-button", "property": "n_clicks", "value": 1}],
            "state": [{"id": "summary-ai-profile", "property": "data", "value": key}],
            "changedPropIds": ["summary-ai-button.n_clicks"]}
    r = app.server.test_client().post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.data[:300]
    return json.dumps(r.get_json()["response"]["summary-ai"]["children"])


def test_summary_is_off_by_default(app, profile):
    page = rendered(data.registry().keys()[0])
    assert "summary-ai-off" in page and "summary-ai-button" not in page


def test_summary_button_shows_the_answer_beside_the_rules(app, profile, aws, monkeypatch):
    monkeypatch.setattr(summary, "_ANSWERS", {})
    monkeypatch.setattr(ai_recommend, "SETTINGS", {"enabled": True, **ai_recommend.settings()})
    key = data.registry().keys()[0]
    page = rendered(key)
    assert "summary-ai-button" in page and "summary-evidence-1" in page
    stubbed(monkeypatch)
    shown = click(app, key)
    assert "summary-ai-label" in shown and "AI-generated by" in shown and json.dumps(ANSWER)[1:-1] in shown
    # paid for once: the Summary shows it again when reopened
    assert json.dumps(ANSWER)[1:-1] in rendered(key)


def test_summary_error_is_one_line_and_the_rules_stay(app, profile, aws, monkeypatch):
    monkeypatch.setattr(summary, "_ANSWERS", {})
    monkeypatch.setattr(ai_recommend, "SETTINGS", {"enabled": True, **ai_recommend.settings()})
    key = data.registry().keys()[0]
    stubbed(monkeypatch, error=("AccessDeniedException", 403, "not authorized"))
    shown = click(app, key)
    assert "summary-ai-error" in shown and "no access to" in shown
    page = rendered(key)
    assert "summary-evidence-1" in page and "summary-ai-error" not in page   # a failure is not kept


def test_view_flag_turns_the_button_on_and_checks_its_settings_first(tmp_path, aws, monkeypatch, capsys):
    profile = make_profile(tmp_path / "20260103_mlp")   # not the one the module's app holds open
    monkeypatch.setattr(ai_recommend, "SETTINGS", {"enabled": False})
    assert cli.main(["view", str(profile), "--ai-recommendation", "--ai-region", "eu-west-1"]) == 1
    assert "US Regions only" in capsys.readouterr().err and not ai_recommend.SETTINGS["enabled"]
    assert cli.main(["view", str(profile), "--ai-recommendation", "--ai-region", "us-west-2", "--ingest-only"]) == 0
    assert ai_recommend.SETTINGS == {"enabled": True, "model": ai_recommend.DEFAULT_MODEL, "region": "us-west-2",
                                     "max_tokens": ai_recommend.MAX_TOKENS}
