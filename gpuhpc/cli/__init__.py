"""The typer CLI: the only package that imports typer and rich."""
