"""One module per dashboard, each declaring `DASHBOARD`; generate.py finds them all."""
