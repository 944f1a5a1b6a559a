"""Filesystem-path templates: ``{Variable}`` placeholders filled from the configuration.

The variables (spec 3) are ``{ThingName}``, ``{ComponentName}``, ``{ComponentFullName}``,
``{InstanceId}`` and every key under ``tags``. Placeholders are replaced by a plain
substitution, never `str.format`, so a template cannot reach attributes or format specs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from unskit.config.model import ComponentConfig
from unskit.errors import ConfigError, ConfigIssue

__all__ = ["path_template_variables", "render_path_template"]

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def path_template_variables(
    config: ComponentConfig, instance_id: str | None = None
) -> dict[str, str]:
    """The variables a path template may use; built-in names win over a tag of the same key."""
    variables = dict(config.tags)
    variables["ThingName"] = config.thing_name
    variables["ComponentName"] = config.component_token
    # The component's address in the namespace: identity path, then the component token.
    variables["ComponentFullName"] = f"{config.identity.path}/{config.component_token}"
    if instance_id is not None:
        variables["InstanceId"] = instance_id
    return variables


def render_path_template(template: str, variables: Mapping[str, str], path: str) -> str:
    """`template` with every placeholder filled; raises ConfigError naming `path` otherwise."""
    unknown = sorted({name for name in _PLACEHOLDER.findall(template) if name not in variables})
    if unknown:
        names = ", ".join(f"{{{name}}}" for name in unknown)
        known = ", ".join(f"{{{name}}}" for name in sorted(variables))
        raise ConfigError(
            [ConfigIssue(path, f"unknown template variable {names} (known: {known})")]
        )
    rest = _PLACEHOLDER.sub("", template)
    if "{" in rest or "}" in rest:
        raise ConfigError([ConfigIssue(path, "has a brace outside a {Variable} placeholder")])
    return _PLACEHOLDER.sub(lambda match: variables[match.group(1)], template)
