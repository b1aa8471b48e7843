"""The Explorer's pages, one module each; component ids carry the page name as a prefix."""
