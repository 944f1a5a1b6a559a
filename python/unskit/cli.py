"""The `unskit` command line.

Exit codes: 0 success; 1 a demo mismatch; 2 a configuration, vault or usage error (nothing
is started or half-written when 2 is returned).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from unskit._core import __version__
from unskit.commands.client import add_call_parser
from unskit.config.loader import ConfigLoader, add_config_arguments, resolve_config
from unskit.config.schema import check_schema
from unskit.config.secrets import SecretRef
from unskit.config.vault import DEFAULT_KEY_ENV, Vault, VaultKey
from unskit.demo.cli import add_demo_parser
from unskit.egress.cli import add_egress_parser
from unskit.errors import ConfigError, ConfigIssue, SecretError
from unskit.fleet.cli import add_fleet_parser
from unskit.messaging.tools import add_tool_parsers
from unskit.recorder.cli import add_record_parser
from unskit.runtime.component import (
    COMPONENT_ENTRY_POINTS,
    ComponentApp,
    load_component,
    run_component,
)

EXIT_OK = 0
EXIT_CONFIG = 2


# -- validate --------------------------------------------------------------------------------


#: The thing name (and component token) `unskit validate` resolves with when none is given,
#: so that every rule a run applies (the component's own included) runs; one topic level.
PLACEHOLDER_THING = "validate-placeholder"


def _validate(args: argparse.Namespace) -> int:
    try:
        loader = ConfigLoader(
            args.config,
            thing=args.thing,
            platform=args.platform,
            config_source=args.config_source,
            default_component=args.component,
        )
        document = loader.read()
        app_class, component_schema, checked = _component_of(args, document, loader)
        thing = loader.thing if loader.thing is not None else PLACEHOLDER_THING
        # The token `unskit run` falls back to: --component's, else the installed class's
        # (a --schema component that is not installed has none to tell).
        default_token = args.component or getattr(app_class, "token", None) or PLACEHOLDER_THING
        config = resolve_config(
            document,
            thing=thing,
            platform=loader.platform,
            component_schema=component_schema,
            default_component=default_token,
            source=loader.source.location,
        )
        check = getattr(app_class, "configuration_issues", None)
        if check is not None and (issues := check(config)):
            raise ConfigError(issues, source=loader.source.location)
        if loader.thing is None:
            detail = (
                f"every rule run with the placeholder thing name {PLACEHOLDER_THING!r}: "
                "give -t/--thing to see the identity"
            )
        else:
            detail = f"identity {config.identity.hier} = {config.identity.path}, "
            detail += f"component {config.component_token}"
    except ConfigError as exc:
        return _report(exc)
    location = loader.source.location
    print(f"OK: {location} is valid on {loader.platform.value} ({detail}; {checked})")
    return EXIT_OK


def _component_of(
    args: argparse.Namespace, document: Mapping[str, Any], loader: ConfigLoader
) -> tuple[type[ComponentApp] | None, Mapping[str, Any] | None, str]:
    """(installed component class, schema of $.component, what checked $.component).

    `--schema FILE` wins; else the installed component named by `--component`, else the one
    the document's ``component.token`` names. ConfigError when none is known: $.component
    would go unchecked, and OK means the whole document was checked.
    """
    component = document.get("component")
    token = component.get("token") if isinstance(component, Mapping) else None
    option = "--component" if args.component else "$.component.token"
    name = args.component or token
    app_class: type[ComponentApp] | None = None
    unknown = ""
    if isinstance(name, str):
        try:
            app_class = load_component(name)
        except ConfigError as exc:
            unknown = exc.issues[0].message
    if args.schema:
        return app_class, _read_schema(args.schema), f"$.component checked by {args.schema}"
    if app_class is not None:
        return app_class, app_class.schema, f"$.component checked as {name} ({option})"
    if unknown:
        issue = ConfigIssue(option, f"{unknown}; give its schema with --schema FILE")
    else:
        issue = ConfigIssue(
            "--component",
            "is required: $.component is checked by its component's schema, so name the "
            f"component ({_installed()}) with --component NAME or in $.component.token, or "
            "give its schema with --schema FILE",
        )
    raise ConfigError([issue], source=loader.source.location)


def _installed() -> str:
    """The installed component names, for a message."""
    names = sorted(e.name for e in entry_points(group=COMPONENT_ENTRY_POINTS))
    return "installed: " + ", ".join(names)


def _read_schema(path: str) -> dict[str, Any]:
    try:
        schema = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError([ConfigIssue("--schema", f"cannot be read as JSON: {exc}")]) from None
    except RecursionError:
        raise ConfigError([ConfigIssue("--schema", "nests too deep to be a schema")]) from None
    if not isinstance(schema, dict):
        raise ConfigError([ConfigIssue("--schema", "must be a JSON Schema object")])
    check_schema(schema, "--schema")
    return schema


def _report(error: ConfigError) -> int:
    where = f"{error.source}: " if error.source else ""
    count = len(error.issues)
    noun = "error" if count == 1 else "errors"
    print(f"{where}{count} configuration {noun}", file=sys.stderr)
    for issue in error.issues:
        print(f"  {issue.path}: {issue.message}", file=sys.stderr)
    return EXIT_CONFIG


# -- vault -----------------------------------------------------------------------------------


def _vault(args: argparse.Namespace) -> int:
    try:
        if args.vault_command == "keygen":
            return _keygen(Path(args.key_file), force=args.force)
        if args.key_file:
            key = VaultKey.from_file(args.key_file)
        else:
            key = VaultKey.from_env(args.key_env or DEFAULT_KEY_ENV)
        vault = Vault(args.vault, key)
        if args.vault_command == "list":
            for name in vault.names():
                print(name)
        elif args.vault_command == "put":
            vault.put(args.name, _read_value(args), keep_versions=args.keep_versions)
            print(f"stored secret {args.name!r} in {args.vault}")
        elif args.vault_command == "retire":
            removed = vault.retire_versions(args.name, keep=args.keep)
            print(f"retired {removed} earlier version(s) of {args.name!r}")
        elif args.vault_command == "delete":
            if not vault.delete(args.name):
                print(f"vault {args.vault} has no secret named {args.name!r}", file=sys.stderr)
                return EXIT_CONFIG
            print(f"deleted secret {args.name!r}")
        else:
            return _get(vault, args)
    except SecretError as exc:
        print(f"unskit vault: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


def _get(vault: Vault, args: argparse.Namespace) -> int:
    value = vault.get(args.name)
    if args.field is not None:
        secret = vault.resolve(SecretRef(args.name, args.field))
        text = secret.reveal()
        shape = f"field {args.field!r} of a bundle"
    elif isinstance(value, str):
        text = value
        shape = "a value"
    else:
        text = json.dumps(value, indent=2, sort_keys=True)
        shape = f"a bundle with fields {', '.join(sorted(value))}"
    if not args.reveal:
        print(f"secret {args.name!r} is set ({shape}); add --reveal to print it")
        return EXIT_OK
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def _read_value(args: argparse.Namespace) -> str | dict[str, str]:
    if args.from_file:
        try:
            text = Path(args.from_file).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"cannot read {args.from_file}: {exc}") from None
    else:
        # Never from an argument: argv is visible to every user of the machine.
        text = sys.stdin.read()
        if text.endswith("\n"):
            text = text[:-1]
    if not args.json:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        raise SecretError("--json: the value is not valid JSON") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SecretError("--json: the value must be an object of string fields")
    return value


def _keygen(path: Path, *, force: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        print(f"unskit vault: {path} exists; add --force to replace it", file=sys.stderr)
        return EXIT_CONFIG
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(VaultKey.generate().to_text() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    print(f"wrote a new vault key to {path}")
    return EXIT_OK


def _add_vault_parser(commands: Any) -> None:
    vault = commands.add_parser("vault", help="manage the encrypted secrets vault")
    verbs = vault.add_subparsers(dest="vault_command", required=True)

    def common(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = verbs.add_parser(name, help=help_text)
        parser.add_argument("--vault", required=True, metavar="FILE", help="vault file")
        keys = parser.add_mutually_exclusive_group()
        keys.add_argument("--key-file", metavar="F", help="key file (from `vault keygen`)")
        keys.add_argument(
            "--key-env", metavar="VAR", help="variable holding the key (default UNSKIT_VAULT_KEY)"
        )
        return parser

    keygen = verbs.add_parser("keygen", help="write a new random key file (mode 0600)")
    keygen.add_argument("--key-file", required=True, metavar="F")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")

    put = common("put", "store a secret read from stdin (or --from-file)")
    put.add_argument("name")
    put.add_argument("--from-file", metavar="PATH", help="read the value from a file")
    put.add_argument(
        "--json", action="store_true", help="the value is a bundle: a JSON object of strings"
    )
    put.add_argument(
        "--keep-versions",
        type=int,
        default=0,
        metavar="N",
        help="retain up to N earlier values (a ca.trustStore trusts them all during a rollover)",
    )

    retire = common("retire", "drop the retained earlier values of a secret")
    retire.add_argument("name")
    retire.add_argument("--keep", type=int, default=0, metavar="N", help="newest N to keep")

    get = common("get", "show whether a secret is set; its value only with --reveal")
    get.add_argument("name")
    get.add_argument("--field", help="one field of a bundle")
    get.add_argument("--reveal", action="store_true", help="print the value")

    common("list", "list secret names (never values)")

    delete = common("delete", "remove a secret")
    delete.add_argument("name")

    vault.set_defaults(run=_vault)


def _opcua_sim(options: Sequence[str]) -> int:
    # Imported here: asyncua loads only for this command.
    from unskit.opcua.sim import main as sim_main

    return sim_main(options)


def _cip_target_sim(options: Sequence[str]) -> int:
    from unskit.cip.target_sim import main as target_main

    return target_main(options)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="unskit", description="unskit command line")
    parser.add_argument("--version", action="version", version=f"unskit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(commands)

    validate = commands.add_parser(
        "validate", help="validate a configuration; exit 2 listing every error"
    )
    add_config_arguments(validate)
    validate.add_argument(
        "--component",
        metavar="NAME",
        help="the installed component whose schema checks $.component (default: the one "
        "$.component.token names); without one, or --schema, validate refuses (exit 2)",
    )
    validate.add_argument(
        "--schema", metavar="FILE", help="the component's JSON Schema for $.component"
    )
    validate.set_defaults(run=_validate)

    run = commands.add_parser(
        "run",
        help="run a component: unskit run NAME -c FILE -t THING [--broker HOST:PORT]",
        description="Runs the installed component NAME; `unskit run NAME --help` lists its "
        "options.\n\n" + _installed().capitalize().replace(": ", ":\n  ").replace(", ", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # Everything after NAME is the component's own: -h before NAME is this parser's.
        add_help=False,
    )
    run.add_argument("-h", "--help", action="help", help="show this help and exit")
    run.add_argument("component", metavar="NAME", help="an installed component (listed above)")
    run.add_argument(
        "options", nargs=argparse.REMAINDER, help="the component's options (-c, -t, --broker)"
    )
    run.set_defaults(run=lambda a: run_component(a.component, a.options))

    # prefix_chars "+": every option goes through untouched to the sim's own parser.
    sim = commands.add_parser(
        "opcua-sim",
        help="run the OPC UA test server on opc.tcp://127.0.0.1:4840/unskit/ (--help for options)",
        add_help=False,
        prefix_chars="+",
    )
    sim.add_argument("options", nargs=argparse.REMAINDER)
    sim.set_defaults(run=lambda a: _opcua_sim(a.options))

    target = commands.add_parser(
        "cip-target-sim",
        help="run the class-1 EtherNet/IP target on 127.0.0.1:44818/2222 (--help for options)",
        add_help=False,
        prefix_chars="+",
    )
    target.add_argument("options", nargs=argparse.REMAINDER)
    target.set_defaults(run=lambda a: _cip_target_sim(a.options))

    _add_vault_parser(commands)
    add_tool_parsers(commands)
    add_call_parser(commands)
    add_egress_parser(commands)
    add_record_parser(commands)
    add_fleet_parser(commands)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
