"""The reconfiguration layer of `Runtime`: the reload-config verb (the configuration source
read again and applied live) and a changed, valid configuration applied, whether the verb or
the configuration watch brought it: logging at once, the rest through the component's
`reconfigure`, or at restart."""

from __future__ import annotations

import contextlib
import logging

from unskit.commands.codes import ErrorCode
from unskit.commands.verbs import CommandContext, ReloadOutcome, RequestIdRule, Verb
from unskit.config.model import ComponentConfig
from unskit.errors import CommandError, ConfigError
from unskit.runtime.accessors import _Accessors
from unskit.runtime.app import ComponentApp
from unskit.runtime.logging_config import configure_logging

# The logger keeps the name it had before this module was split out of component.py.
_log = logging.getLogger("unskit.runtime.component")


class _Reconfiguring(_Accessors):
    """The reconfiguration layer of `Runtime`: reload-config and configuration applied."""

    def _reload_verb(self, app: ComponentApp | None) -> Verb:
        reason = None
        if getattr(app, "reconfigure", None) is None:
            reason = "this component applies configuration changes only at restart"
        return Verb(
            "reload-config",
            self._reload,
            request_id=RequestIdRule.REQUIRED,
            enabled=reason is None,
            disabled_reason=reason,
            summary="re-read the configuration source and apply it live",
        )

    def _reload(self, _context: CommandContext) -> dict[str, list[str]]:
        if self._loader is None or self._app is None:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY, "this runtime has no configuration source"
            )
        try:
            config = self._loader.resolve(self._loader.read())
            outcome = self.apply_config(config, self._app)
        except ConfigError as error:
            raise CommandError(
                ErrorCode.BAD_ARGS, f"the configuration was rejected, the running one kept: {error}"
            ) from None
        return (outcome or ReloadOutcome()).to_body()

    def apply_config(self, config: ComponentConfig, app: ComponentApp) -> ReloadOutcome | None:
        """A changed, valid configuration: logging follows at once; the component applies
        the rest through its `reconfigure(config)` if it has one, else a restart does.
        While it applies, every command verb answers DEVICE_UNAVAILABLE."""
        with self._inbox.draining() if self._inbox is not None else contextlib.nullcontext():
            return self._apply_config(config, app)

    def _apply_config(self, config: ComponentConfig, app: ComponentApp) -> ReloadOutcome | None:
        reconfigure = getattr(app, "reconfigure", None)
        outcome: ReloadOutcome | None = None
        if reconfigure is not None:
            # A rejection (ConfigError) leaves the running configuration in place.
            outcome = reconfigure(config)
        previous, self.config = self.config, config
        if config.logging != previous.logging:
            configure_logging(config.logging, config.platform)
        if outcome is not None and self.events is not None:
            self.events.info("config-applied", outcome.to_body())
        if reconfigure is None and config.document != previous.document:
            _log.warning(
                "configuration changed; %s applies only logging changes live, restart it "
                "to apply the rest",
                config.component_token,
            )
        return outcome

    def _apply_watched(self, config: ComponentConfig, app: ComponentApp) -> None:
        try:
            self.apply_config(config, app)
        except ConfigError as error:
            _log.warning("configuration change rejected, keeping the running one: %s", error)
