"""Typed, validated specs. Import submodules directly (``gpuhpc.spec.cluster``)."""
