"""`dike-slurm policies`: the registered policies with their parameters."""

from __future__ import annotations

from rich.table import Table

from dike_slurm.cli import app, console, err_console


def _default_text(field) -> str:
    if field.default_factory is not None:
        return repr(field.default_factory())
    return repr(field.default)


@app.command("policies")
def policies_command() -> None:
    """List every registered policy, its description and its parameters with defaults."""
    from dike_slurm.registry import default_registry

    registry = default_registry()
    table = Table(title="policies", show_lines=True)
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("live")
    table.add_column("parameters (default)")
    for name in registry.names():
        policy = registry.get(name)
        params = "\n".join(
            f"{key} = {_default_text(field)}" for key, field in policy.Params.model_fields.items()
        ) or "-"
        table.add_row(name, policy.description, "yes" if policy.live else "replay only", params)
    console.print(table)
    for broken in registry.broken:
        err_console.print(f"[yellow]warning:[/] policy plugin {broken.name!r} ({broken.target}) failed to load: {broken.error}", highlight=False)
