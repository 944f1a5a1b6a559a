"""configure_logging: format precedence, JSON sink, per-logger levels, rotation, validation."""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from unskit.config.model import DEFAULT_PYTHON_FORMAT, LoggingConfig, parse_size
from unskit.config.platform import Platform
from unskit.errors import ConfigError
from unskit.runtime.logging_config import (
    LIBRARY_LOGGERS,
    LIBRARY_REPEAT_WINDOW_S,
    configure_logging,
)

DEFAULT_TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[WARNING\] unskit\.test\.prec: hello"
)


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    saved_handlers = list(root.handlers)
    saved_level = root.level
    yield
    # An empty section resets the per-logger levels this module set and closes its handlers.
    configure_logging({})
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in saved_handlers:
        root.addHandler(handler)
    root.setLevel(saved_level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("config", "platform", "expected"),
    [
        pytest.param(
            {"python_format": "%(levelname)s|%(name)s|%(message)s"},
            Platform.CLUSTER,
            "explicit",
            id="explicit-text-beats-cluster",
        ),
        pytest.param({"python_format": "JSON"}, Platform.HOST, "json", id="explicit-json-on-host"),
        pytest.param({"python_format": "json"}, None, "json", id="explicit-json-no-platform"),
        pytest.param({}, Platform.CLUSTER, "json", id="cluster-default-json"),
        pytest.param({}, Platform.HOST, "default", id="host-default-text"),
        pytest.param({}, Platform.EDGE_RUNTIME, "default", id="edge-runtime-default-text"),
        pytest.param({}, None, "default", id="no-platform-default-text"),
        pytest.param(
            {"java_format": "json", "rust_format": "json", "ts_format": "json"},
            Platform.HOST,
            "default",
            id="other-variants-keys-ignored",
        ),
    ],
)
def test_format_precedence(config, platform, expected, capsys):
    configure_logging(config, platform)
    logging.getLogger("unskit.test.prec").warning("hello")
    captured = capsys.readouterr()
    if expected == "json":
        assert captured.err == ""
        [line] = json_lines(captured.out)
        assert line["message"] == "hello"
        assert line["level"] == "WARNING"
    elif expected == "explicit":
        assert captured.out == ""
        assert captured.err == "WARNING|unskit.test.prec|hello\n"
    else:
        assert captured.out == ""
        assert DEFAULT_TEXT_LINE.fullmatch(captured.err.rstrip("\n"))


def test_default_format_is_the_spec_default():
    assert LoggingConfig.from_section(None).format == DEFAULT_PYTHON_FORMAT
    assert DEFAULT_PYTHON_FORMAT == "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def test_json_line_field_layout(capsys):
    configure_logging({"python_format": "json"})
    before = datetime.now(timezone.utc)
    logging.getLogger("unskit.test.json").info("value is %d", 42)
    after = datetime.now(timezone.utc)
    [line] = json_lines(capsys.readouterr().out)
    assert set(line) == {"timestamp", "level", "logger", "message", "thread"}
    assert line["level"] == "INFO"
    assert line["logger"] == "unskit.test.json"
    assert line["message"] == "value is 42"
    assert line["thread"] == "MainThread"
    assert line["timestamp"].endswith("Z")
    stamp = datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    # Millisecond precision truncates, so allow the instant to sit up to 1 ms before `before`.
    assert before - timedelta(milliseconds=1) <= stamp <= after


def test_json_line_carries_extra_fields(capsys):
    configure_logging({"python_format": "json"})

    class Opaque:
        def __str__(self) -> str:
            return "opaque-thing"

    logging.getLogger("unskit.test.json").info(
        "with extras", extra={"instance": "plc-1", "attempt": 3, "obj": Opaque()}
    )
    [line] = json_lines(capsys.readouterr().out)
    assert line["instance"] == "plc-1"
    assert line["attempt"] == 3
    assert line["obj"] == "opaque-thing"


def test_json_extra_colliding_with_a_fixed_field_is_prefixed(capsys):
    configure_logging({"python_format": "json"})
    logging.getLogger("unskit.test.json").warning("clash", extra={"level": "mine"})
    [line] = json_lines(capsys.readouterr().out)
    assert line["level"] == "WARNING"
    assert line["extra_level"] == "mine"


def test_json_exception_stays_on_one_line(capsys):
    configure_logging({"python_format": "json"})
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        logging.getLogger("unskit.test.json").exception("failed")
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    [line] = json_lines(out)
    assert line["message"] == "failed"
    assert line["exc_info"].startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: boom" in line["exc_info"]


def test_json_thread_name_is_the_logging_thread(capsys):
    import threading

    configure_logging({"python_format": "json"})
    worker = threading.Thread(
        target=lambda: logging.getLogger("unskit.test.json").info("from worker"), name="poller-7"
    )
    worker.start()
    worker.join()
    [line] = json_lines(capsys.readouterr().out)
    assert line["thread"] == "poller-7"


def test_calling_twice_does_not_duplicate_output(capsys):
    configure_logging({"python_format": "json"})
    configure_logging({"python_format": "json"})
    logging.getLogger("unskit.test.twice").info("once")
    assert len(json_lines(capsys.readouterr().out)) == 1


def test_root_handlers_are_cleared():
    root = logging.getLogger()
    foreign = logging.handlers.BufferingHandler(100)
    root.addHandler(foreign)
    configure_logging({})
    logging.getLogger("unskit.test.clear").warning("not for the foreign handler")
    assert foreign not in root.handlers
    assert foreign.buffer == []


def test_level_defaults_to_info(capsys):
    configure_logging({})
    log = logging.getLogger("unskit.test.level")
    log.debug("hidden")
    log.info("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err
    assert "shown" in err
    assert logging.getLogger().level == logging.INFO


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("debug", logging.DEBUG),
        ("Warning", logging.WARNING),
        ("WARN", logging.WARNING),
        ("ERROR", logging.ERROR),
        ("critical", logging.CRITICAL),
        ("FATAL", logging.CRITICAL),
        ("TRACE", logging.DEBUG),
        ("OFF", logging.CRITICAL + 10),
    ],
)
def test_level_names_are_case_insensitive_and_shared_schema_names_map(name, level):
    configure_logging({"level": name})
    assert logging.getLogger().level == level


def test_per_logger_levels(capsys):
    configure_logging({"level": "INFO", "loggers": {"noisy": "ERROR", "chatty": "debug"}})
    logging.getLogger("noisy").warning("noisy-warning")
    logging.getLogger("noisy.child").warning("noisy-child-warning")
    logging.getLogger("noisy").error("noisy-error")
    logging.getLogger("chatty").debug("chatty-debug")
    logging.getLogger("other").debug("other-debug")
    err = capsys.readouterr().err
    assert "noisy-warning" not in err
    assert "noisy-child-warning" not in err
    assert "noisy-error" in err
    assert "chatty-debug" in err
    assert "other-debug" not in err


@pytest.mark.parametrize(
    ("section", "library", "amqtt"),
    [
        pytest.param({}, logging.WARNING, logging.WARNING, id="warning-by-default"),
        pytest.param({"level": "DEBUG"}, logging.WARNING, logging.WARNING, id="debug-root"),
        pytest.param({"level": "ERROR"}, logging.ERROR, logging.ERROR, id="never-below-root"),
        pytest.param({"libraryLevel": "info"}, logging.INFO, logging.INFO, id="configured"),
        pytest.param(
            {"level": "ERROR", "libraryLevel": "DEBUG"},
            logging.DEBUG,
            logging.DEBUG,
            id="configured-below-root",
        ),
        pytest.param(
            {"loggers": {"amqtt": "DEBUG"}},
            logging.WARNING,
            logging.DEBUG,
            id="a-named-logger-wins",
        ),
    ],
)
def test_third_party_loggers_follow_library_level(section, library, amqtt):
    configure_logging(section)
    assert logging.getLogger("amqtt").level == amqtt
    for name in set(LIBRARY_LOGGERS) - {"amqtt"}:
        assert logging.getLogger(name).level == library, name


def test_a_library_info_line_is_not_written_by_default(capsys):
    configure_logging({"level": "DEBUG"})
    logging.getLogger("amqtt.broker").info("amqtt-info")
    logging.getLogger("transitions.core").info("transitions-info")
    logging.getLogger("botocore.credentials").warning("botocore-warning")
    logging.getLogger("unskit.test.own").debug("own-debug")
    err = capsys.readouterr().err
    assert "amqtt-info" not in err
    assert "transitions-info" not in err
    assert "botocore-warning" in err
    assert "own-debug" in err


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import unskit.runtime.logging_config as logging_config

    clock = _Clock()
    monkeypatch.setattr(logging_config, "_now", clock)
    return clock


def _parse_error(logger: logging.Logger) -> None:
    try:
        raise ValueError("buffer empty")
    except ValueError:
        logger.exception("Failed to parse reply")


def test_a_library_s_repeated_traceback_is_one_line_per_window(clock, tmp_path, capsys):
    path = tmp_path / "c.log"
    configure_logging({"fileLogging": {"enabled": True, "filePath": str(path)}})
    library = logging.getLogger("pycomm3.packets.ethernetip.SendRRDataResponsePacket")
    for _ in range(5):
        _parse_error(library)
        clock.now += 1
    library.error("another line %s", "once")
    clock.now += LIBRARY_REPEAT_WINDOW_S
    _parse_error(library)
    for written in (capsys.readouterr().err, path.read_text(encoding="utf-8")):
        assert "Traceback" not in written
        lines = [line for line in written.splitlines() if "pycomm3" in line]
        assert [line.split("] ", 1)[1] for line in lines] == [
            "pycomm3.packets.ethernetip.SendRRDataResponsePacket: Failed to parse reply "
            "(ValueError: buffer empty)",
            "pycomm3.packets.ethernetip.SendRRDataResponsePacket: another line once",
            "pycomm3.packets.ethernetip.SendRRDataResponsePacket: Failed to parse reply "
            "(ValueError: buffer empty; 4 more like it since the last one written)",
        ]


def test_own_lines_and_a_library_at_debug_are_written_whole(clock, capsys):
    configure_logging({"loggers": {"pycomm3": "DEBUG"}})
    for _ in range(3):
        _parse_error(logging.getLogger("pycomm3.cip_driver"))
        _parse_error(logging.getLogger("unskit.test.own"))
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 6
    assert err.count("pycomm3.cip_driver: Failed to parse reply\n") == 3
    assert err.count("unskit.test.own: Failed to parse reply\n") == 3


def test_reconfigure_applies_a_changed_library_level():
    configure_logging({"libraryLevel": "INFO"})
    configure_logging({})
    assert logging.getLogger("pycomm3").level == logging.WARNING


@pytest.mark.integration
def test_the_embedded_broker_is_quiet_in_a_component_log(tmp_path):
    # `unskit run` with an embedded broker, as examples/echo.json runs: its own INFO lines,
    # none of amqtt's; libraryLevel INFO brings them back.
    def run_echo(logging_section):
        document = {"component": {}, "messaging": {"local": {"host": "embedded", "port": 0}}}
        document["logging"] = logging_section
        config = tmp_path / "echo.json"
        config.write_text(json.dumps(document))
        command = [sys.executable, "-m", "unskit.cli", "run", "echo", "-c", str(config)]
        with subprocess.Popen(
            [*command, "-t", "gw-01"], stderr=subprocess.PIPE, text=True
        ) as process:
            assert process.stderr is not None
            lines = []
            try:
                for line in process.stderr:
                    lines.append(line)
                    if "echo running" in line:
                        process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0, "".join(lines)
            finally:
                # Popen's exit waits for the child: a hung one must not hang the test run.
                if process.poll() is None:
                    process.kill()
        return "".join(lines)

    quiet = run_echo({"level": "INFO"})
    assert "[INFO] unskit.runtime.embedded_broker" in quiet
    assert "amqtt" not in quiet
    assert "transitions" not in quiet
    loud = run_echo({"level": "INFO", "libraryLevel": "INFO"})
    assert "[INFO] amqtt.broker" in loud


def test_reconfigure_resets_a_logger_dropped_from_the_map():
    configure_logging({"loggers": {"unskit.test.dropped": "ERROR", "unskit.test.kept": "DEBUG"}})
    configure_logging({"loggers": {"unskit.test.kept": "WARNING"}})
    assert logging.getLogger("unskit.test.dropped").level == logging.NOTSET
    assert logging.getLogger("unskit.test.kept").level == logging.WARNING


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"level": "LOUD"}, "logging.level"),
        ({"level": 10}, "logging.level"),
        ({"loggers": {"pkg.mod": "VERBOSE"}}, "logging.loggers.pkg.mod"),
        ({"loggers": ["pkg"]}, "logging.loggers"),
        ({"python_format": "%(message"}, "logging.python_format"),
        ({"python_format": "{message}"}, "logging.python_format"),
        ({"python_format": ""}, "logging.python_format"),
        ({"fileLogging": {"maxFileSize": "10XB"}}, "logging.fileLogging.maxFileSize"),
        ({"fileLogging": {"maxFileSize": "0MB"}}, "logging.fileLogging.maxFileSize"),
        ({"fileLogging": {"maxFileSize": "0"}}, "logging.fileLogging.maxFileSize"),
        ({"fileLogging": {"backupCount": 0}}, "logging.fileLogging.backupCount"),
        ({"fileLogging": {"backupCount": "5"}}, "logging.fileLogging.backupCount"),
        ({"fileLogging": {"enabled": "yes"}}, "logging.fileLogging.enabled"),
        ({"fileLogging": {"enabled": True}}, "logging.fileLogging.filePath"),
        ({"fileLogging": "on"}, "logging.fileLogging"),
        ({"globalControl": "yes"}, "logging.globalControl"),
        ({"libraryLevel": "QUIET"}, "logging.libraryLevel"),
    ],
)
def test_invalid_values_raise_naming_the_key(config, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        configure_logging(config)


def test_invalid_configuration_keeps_the_previous_setup(capsys):
    configure_logging({"python_format": "json", "level": "DEBUG"})
    with pytest.raises(ValueError, match=r"logging\.level"):
        configure_logging({"level": "LOUD"})
    logging.getLogger("unskit.test.keep").debug("still json")
    [line] = json_lines(capsys.readouterr().out)
    assert line["message"] == "still json"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10MB", 10 * 1024 * 1024),
        ("512KB", 512 * 1024),
        ("1GB", 1024**3),
        ("4096", 4096),
        ("100B", 100),
        ("10 mb", 10 * 1024 * 1024),
        ("10M", 10 * 1024 * 1024),
        ("2KiB", 2048),
        ("1.5MB", 1536 * 1024),
        (2048, 2048),
        # A size of 0 parses; fileLogging refuses it (see test_invalid_values_raise_naming_the_key).
        ("0", 0),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["10XB", "", "MB", "-1MB", -1, "1 0MB", True, None, 1.5])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match=r"logging\.fileLogging\.maxFileSize"):
        parse_size(text)


def test_file_logging_rotates(tmp_path):
    path = tmp_path / "nested" / "logs" / "component.log"
    configure_logging(
        {
            "python_format": "%(levelname)s %(message)s",
            "fileLogging": {
                "enabled": True,
                "filePath": str(path),
                "maxFileSize": "1KB",
                "backupCount": 2,
            },
        }
    )
    log = logging.getLogger("unskit.test.rotate")
    for i in range(100):
        log.warning("line %03d %s", i, "x" * 40)
    assert path.exists()
    assert path.with_name("component.log.1").exists()
    assert path.with_name("component.log.2").exists()
    assert not path.with_name("component.log.3").exists()
    for name in ("component.log", "component.log.1", "component.log.2"):
        assert path.with_name(name).stat().st_size <= 1024
    last = path.read_text(encoding="utf-8").splitlines()[-1]
    assert last == "WARNING line 099 " + "x" * 40
    rotated = path.with_name("component.log.1").read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("WARNING line ") for line in rotated)


def test_file_logging_defaults():
    settings = LoggingConfig.from_section(
        {"fileLogging": {"enabled": True, "filePath": "/x/y.log"}}
    )
    assert settings.file_logging.max_file_size == 10 * 1024 * 1024
    assert settings.file_logging.backup_count == 5


def test_file_logging_installs_a_rotating_handler(tmp_path):
    path = tmp_path / "c.log"
    configure_logging({"fileLogging": {"enabled": True, "filePath": str(path)}})
    [handler] = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.handlers.RotatingFileHandler)
    ]
    assert handler.maxBytes == 10 * 1024 * 1024
    assert handler.backupCount == 5
    logging.getLogger("unskit.test.file").warning("to the file")
    assert "[WARNING] unskit.test.file: to the file" in path.read_text(encoding="utf-8")


def test_file_logging_disabled_writes_no_file(tmp_path):
    path = tmp_path / "c.log"
    configure_logging({"fileLogging": {"enabled": False, "filePath": str(path)}})
    logging.getLogger("unskit.test.file").warning("only to stderr")
    assert not path.exists()


@pytest.mark.parametrize("platform", [Platform.CLUSTER, Platform.HOST])
def test_file_logging_with_the_json_sink_writes_json_lines_to_the_file(tmp_path, platform, capsys):
    # Issue 36: with JSON logs (explicit, or the CLUSTER default) the file was silently
    # never written.
    path = tmp_path / "c.log"
    config = {"fileLogging": {"enabled": True, "filePath": str(path)}}
    if platform is Platform.HOST:
        config["python_format"] = "json"
    configure_logging(config, platform)
    logging.getLogger("unskit.test.file").warning("json in both")
    [in_file] = json_lines(path.read_text(encoding="utf-8"))
    assert in_file["message"] == "json in both"
    assert in_file["logger"] == "unskit.test.file"
    assert json_lines(capsys.readouterr().out)[0]["message"] == "json in both"


def test_a_log_file_that_cannot_be_opened_is_a_configuration_error(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    configure_logging({"python_format": "json"})
    with pytest.raises(ConfigError, match=r"\$\.logging\.fileLogging\.filePath: cannot be opened"):
        configure_logging({"fileLogging": {"enabled": True, "filePath": str(blocker / "c.log")}})
    logging.getLogger("unskit.test.keep").warning("still json")
    [line] = json_lines(capsys.readouterr().out)
    assert line["message"] == "still json", "the previous setup stays"


def test_reconfigure_closes_the_previous_file_handler(tmp_path):
    path = tmp_path / "c.log"
    configure_logging({"fileLogging": {"enabled": True, "filePath": str(path)}})
    [old] = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.handlers.RotatingFileHandler)
    ]
    configure_logging({})
    assert old.stream is None
    logging.getLogger("unskit.test.file").warning("after reconfigure")
    assert "after reconfigure" not in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("value", [True, False])
def test_global_control_is_parsed_and_ignored(value, capsys):
    configure_logging({"globalControl": value, "python_format": "json"})
    assert LoggingConfig.from_section({"globalControl": value}).global_control is value
    logging.getLogger("unskit.test.global").info("same behaviour")
    assert json_lines(capsys.readouterr().out)[0]["message"] == "same behaviour"


def test_a_logging_config_object_is_applied_as_built(capsys):
    # Built for CLUSTER, so JSON, whatever platform (if any) the call names.
    config = LoggingConfig.from_section(
        {"level": "warn", "loggers": {"chatty": "trace"}}, Platform.CLUSTER
    )
    configure_logging(config, Platform.HOST)
    assert logging.getLogger().level == logging.WARNING
    assert logging.getLogger("chatty").level == logging.DEBUG
    logging.getLogger("unskit.test.object").warning("as built")
    [line] = json_lines(capsys.readouterr().out)
    assert line["message"] == "as built"
    configure_logging(LoggingConfig())
    assert logging.getLogger("chatty").level == logging.NOTSET


def test_a_raw_section_and_its_config_object_configure_alike():
    section = {"level": "ERROR", "loggers": {"unskit.test.alike": "FATAL"}}
    configure_logging(section, Platform.HOST)
    from_section = (logging.getLogger().level, logging.getLogger("unskit.test.alike").level)
    configure_logging({})
    configure_logging(LoggingConfig.from_section(section, Platform.HOST))
    from_object = (logging.getLogger().level, logging.getLogger("unskit.test.alike").level)
    assert from_section == from_object == (logging.ERROR, logging.CRITICAL)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"level": "LOUD"}, "logging.level"),
        ({"format": "{message}"}, "logging.python_format"),
        ({"loggers": {"x": "LOUD"}}, "logging.loggers.x"),
        ({"global_control": 1}, "logging.globalControl"),
    ],
)
def test_a_logging_config_built_directly_is_checked_too(kwargs, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        LoggingConfig(**kwargs)
