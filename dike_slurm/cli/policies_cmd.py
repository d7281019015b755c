"""`dike-slurm policies`: the registered policies with their parameters."""

from __future__ import annotations

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.common import JSON_OPTION, emit_json, table


def _default(field) -> object:
    return field.default_factory() if field.default_factory is not None else field.default


@app.command("policies")
def policies_command(as_json: bool = JSON_OPTION) -> None:
    """List every registered policy, its description and its parameters with defaults."""
    from pydantic_core import to_jsonable_python

    from dike_slurm.registry import default_registry

    registry = default_registry()
    policies = [
        {"name": name, "description": registry.get(name).description, "live": registry.get(name).live,
         "parameters": {key: to_jsonable_python(_default(field))
                        for key, field in registry.get(name).Params.model_fields.items()}}
        for name in registry.names()
    ]
    broken = [{"name": b.name, "target": b.target, "error": str(b.error)} for b in registry.broken]
    if as_json:
        emit_json("policies", None, {"policies": policies, "broken": broken})
        return
    result = table("policies", ["name", "description", "live", "parameters (default)"])
    result.show_lines = True
    for policy in policies:
        params = "\n".join(f"{key} = {value!r}" for key, value in policy["parameters"].items()) or "-"
        result.add_row(policy["name"], policy["description"], "yes" if policy["live"] else "replay only", params)
    console.print(result, highlight=False)
    for plugin in broken:
        err_console.print(f"[yellow]warning:[/] policy plugin {plugin['name']!r} ({plugin['target']}) failed to load: "
                          f"{plugin['error']}", highlight=False)
