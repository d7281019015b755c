"""Jinja2 templates (installed as package data under dike_slurm.templates)."""
