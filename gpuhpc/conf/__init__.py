"""Cluster spec -> Slurm config files: validation rules, template context, renderer."""
