"""What every command does at its edges: a user's mistake ends in one line, a signal in its status.

    if __name__ == "__main__":
        sys.exit(cli.run(main))        # argparse commands: convert, inference, the data build
    app.run(cli.wrap(main))            # train.py (absl)

Exit statuses of every command (train.py and each `python -m bert_jax.*`):

* 0: done.
* 1: an error. A user's mistake (`is_user_error`: a bad config value or flag, a missing or
  unreadable file, a checkpoint that does not fit) prints one line, `error: <message>`, on stderr;
  anything else is a bug and keeps its Python traceback. 2: bad command-line syntax (argparse).
* 128 + the signal: stopped by SIGINT (130, Ctrl-C) or SIGTERM (143, preemption): a training run
  saves a checkpoint first and says where it stopped; rerunning the command resumes. A stopped run
  is never reported as success, so `train.py && next` does not go on with an unfinished model, and
  a scheduler that requeues failed jobs requeues a preempted one.

Which exceptions are a user's mistake: every exception class the project defines
(`RestoreError`, `ConversionError`, `RecordFileError`, ...: their messages are written for the
user), and the built-in types of bad input (`USER_ERROR_TYPES`: ValueError, the missing or
existing file errors, FloatingPointError) when the project's own code raised them (its `raise`
names the key, file or line). The same built-in types raised inside a library (numpy, JAX) are
bugs here: they keep the traceback. To report a new kind of mistake, raise one of those types (or
a subclass) with a message that names the key, file or line. A storage service out of reach (a
gs:// bucket without network or credentials: `paths.unreachable_storage`) is one too, and so is
a folder to be made where a file is (an --output or --workdir naming a file:
`paths.file_in_place_of_folder`).

Ctrl-C: Python raises KeyboardInterrupt wherever the main thread is, and where that is a garbage
collector callback (JAX registers one) the exception is printed as "Exception ignored" and lost.
`run`/`wrap` install a SIGINT handler that raises it again where it was lost (`_Interrupt`), so
Ctrl-C stops the command whatever it was doing.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable, Sequence

# Built-in exception types that are a user's mistake when the project's code raised them.
USER_ERROR_TYPES = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    FloatingPointError,
)
# Where the project's own code lives: the package, train.py and the configs.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_PACKAGE_DIR)
_OWN = (_PACKAGE_DIR + os.sep, os.path.join(_ROOT, "train.py"), os.path.join(_ROOT, "configs"))
# Where absl's and ml_collections' flag parsing lives (their wrappers of a config's errors).
_FLAG_LIBRARIES = tuple(os.sep + p + os.sep for p in ("absl", "ml_collections"))
# Seconds after which a KeyboardInterrupt that was lost is raised again.
_INTERRUPT_RETRY_S = 0.2


def _raised_here(error: BaseException) -> bool:
    """Whether the innermost Python frame of `error`'s traceback is the project's code."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_OWN)


def users_mistake(error: BaseException) -> BaseException | None:
    """`error` as the user sees it when it is their mistake (`is_user_error`; a storage
    service out of reach as `paths.unreachable_storage`'s "cannot reach gs://...", a folder
    to be made where a file is as `paths.file_in_place_of_folder`'s "X is a file"), else None
    (a bug, which keeps its traceback)."""
    from bert_jax.paths import file_in_place_of_folder, unreachable_storage

    mistake = unreachable_storage(error) or file_in_place_of_folder(error) or error
    return mistake if is_user_error(mistake) else None


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is a user's mistake with a message for them (module docstring), not a
    bug: a project exception class, or a `USER_ERROR_TYPES` raised by the project's code."""
    if not isinstance(error, Exception):
        return False
    for cls in type(error).__mro__:
        if cls.__module__.split(".")[0] == "bert_jax":
            return True
    return isinstance(error, USER_ERROR_TYPES) and _raised_here(error)


class _Interrupt:
    """The command's SIGINT handler: raises KeyboardInterrupt, except where it would be lost
    (inside a garbage collector callback, or printed as "Exception ignored" by
    `sys.unraisablehook`): there it delivers the signal again `_INTERRUPT_RETRY_S` later
    (`_thread.interrupt_main`), to whatever SIGINT handler is current then (the training loop's
    saves and stops)."""

    def __init__(self):
        self.interrupted = False  # a SIGINT came while the command ran
        self.active = True
        self.previous = signal.signal(signal.SIGINT, self._handle)
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable

    def _handle(self, signum, frame):
        self.interrupted = True
        if frame is not None and any(
            getattr(c, "__code__", None) is frame.f_code for c in gc.callbacks
        ):
            self._again()
            return
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if self.active and isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._again()
            return
        self.previous_hook(unraisable)

    def _again(self) -> None:
        timer = threading.Timer(_INTERRUPT_RETRY_S, self._deliver)
        timer.daemon = True
        timer.start()

    def _deliver(self) -> None:
        import _thread

        if self.active:
            _thread.interrupt_main(signal.SIGINT)

    def done(self) -> None:
        if self.active:
            self.active = False
            signal.signal(signal.SIGINT, self.previous)
            sys.unraisablehook = self.previous_hook


def _call(main: Callable[..., int | None], *args, leave_at_once: bool = False) -> int:
    """main(*args) -> its exit status, with the module docstring's treatment of errors and
    signals. A SIGINT that never reached here as KeyboardInterrupt (a library turned it into
    another error) still makes the status 130. `leave_at_once`: after a user's mistake, end the
    process right after its line (`_leave`)."""
    interrupt, message = None, None
    if threading.current_thread() is threading.main_thread():
        interrupt = _Interrupt()
    try:
        try:
            code = main(*args) or 0
        except KeyboardInterrupt:
            code = None
        except Exception as e:  # noqa: BLE001  (sorted into mistakes and bugs)
            mistake = users_mistake(e)  # a bucket out of reach too: the user's to fix
            if interrupt is not None and interrupt.interrupted:
                code = None
            elif mistake is None:
                raise
            else:
                message, code = f"error: {mistake}", 1
        if message:
            _collect_quietly()
            if leave_at_once:
                _leave(code, message)
            sys.stdout.flush()
            print(message, file=sys.stderr)
        if interrupt is not None:
            interrupt.done()
            if interrupt.interrupted and code == 0:
                code = None
        if code is None:
            print("stopped: interrupted (SIGINT)", file=sys.stderr)
            code = 128 + signal.SIGINT
        return code
    finally:
        if interrupt is not None:
            interrupt.done()


def _leave(code: int, message: str) -> None:
    """Prints `message` as the last line on stderr and ends the process now, without the
    interpreter's shutdown: work that the error abandoned in library threads (an Orbax restore's
    TensorStore reads) fails there with tracebacks ("Event loop is closed") that would follow,
    drown, or split the error line. Such a thread may be halfway through a line when the error
    arrives (its "RuntimeError" printed, the rest not yet), so stderr goes to /dev/null for
    everyone else first and the message follows an empty line on a copy of the descriptor.
    Checkpoint saves are already complete when an error reaches here (the loop waits for them)."""
    from absl import logging

    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # their threads may still be printing
    data = f"\n{message}\n".encode(errors="replace")
    while data:
        data = data[os.write(terminal, data) :]
    os._exit(code)


def _collect_quietly() -> None:
    """Collects what the failed work left (its frames are free once the exception is handled):
    coroutines and buffers that libraries abandoned mid-way complain as they go ("Exception
    ignored in ..."), which would drown the error line. Their complaints go to the debug log."""
    from absl import logging

    def log(unraisable) -> None:
        logging.debug("after the error: %s: %s", unraisable.err_msg, unraisable.exc_value)

    previous, sys.unraisablehook = sys.unraisablehook, log
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous


def run(main: Callable[[Sequence[str] | None], int | None], argv=None) -> int:
    """Runs an argparse command's `main(argv)`; returns the exit status (module docstring)."""
    return _call(main, argv)


def parse_absl_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing (`app.run(..., flags_parser=cli.parse_absl_flags)`), where an unknown
    `--config.<key>` (ml_collections raises AttributeError or KeyError, with "Did you mean ...")
    ends in `error: <message>` and status 1 too, not in a traceback; so does a user's mistake
    that a config file's `get_config` raised while absl parsed the flags (a variant
    `--config=configs/X.py:key=value` with an unknown key or value: `_config_mistake`), a flag
    value absl or ml_collections refuse (`--config.finetune.num_epochs=abc`, an unknown flag)
    and a config file that does not load. A bug in a config file keeps absl's report with its
    traceback."""
    from absl import flags

    try:
        argv = flags.FLAGS(argv)
    except flags.Error as e:
        mistake = _config_mistake(e)
        if mistake is not None:
            print(f"error: {mistake}", file=sys.stderr)
        elif _cause_outside_flag_libraries(e) is None:  # their own reading of the command line
            print(f"error: {e}".replace("\n", "; "), file=sys.stderr)
        else:  # a bug in a config file: as absl's `app.parse_flags_with_usage` reports it
            text = str(e)
            text = "\n" + textwrap.indent(text, "  ") if "\n" in text else " " + text
            print(f"FATAL Flags parsing error:{text}", file=sys.stderr)
            print("Pass --helpshort or --helpfull to see help on flags.", file=sys.stderr)
        sys.exit(1)
    except (AttributeError, KeyError) as e:
        while isinstance(e.args[0] if e.args else None, BaseException):
            e = e.args[0]  # ml_collections wraps the KeyError that holds the message
        text = str(e.args[0]) if e.args else str(e)
        print(f"error: unknown config key {text}".replace("\n", "; "), file=sys.stderr)
        sys.exit(1)
    _check_config_file_loaded(flags.FLAGS)
    return argv


def _check_config_file_loaded(values) -> None:
    """ml_collections defers a config file it could not load (a path that does not exist) to
    the first read of the flag's value: read it here, so the mistake is one `error:` line."""
    if "config" not in values or not values["config"].present:
        return
    try:
        getattr(values["config"].value, "lock", None)  # a failed load's placeholder raises
    except OSError as e:
        reason = [line.strip() for line in str(e).splitlines() if line.strip()][-1]
        print(f"error: {values['config'].serialize()}: {reason}", file=sys.stderr)
        sys.exit(1)


def _config_mistake(error: BaseException) -> BaseException | None:
    """The user's mistake (`is_user_error`) behind absl's flag `error`, or None: absl wraps what
    a flag's parser raised, and ml_collections what a config's `get_config` raised (their
    exceptions' `__context__`); the first exception that neither raised is the one looked at."""
    cause = _cause_outside_flag_libraries(error)
    return cause if cause is not None and is_user_error(cause) else None


def _cause_outside_flag_libraries(error: BaseException) -> BaseException | None:
    """The first exception behind `error` (its `__context__` chain) that neither absl nor
    ml_collections raised; None when they raised every one (their own check of a flag)."""
    cause = error.__context__
    while cause is not None and _raised_by(cause, _FLAG_LIBRARIES):
        cause = cause.__context__
    return cause


def _raised_by(error: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether the innermost Python frame of `error`'s traceback is in one of `packages`."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and any(p in frames[-1].filename for p in packages)


def wrap(main: Callable[[list[str]], int | None]) -> Callable[[list[str]], int]:
    """An absl `main(argv)` with the module docstring's errors and signals, for `app.run` (the
    process then ends right after a user's mistake's line: `_leave`)."""

    @functools.wraps(main)
    def wrapped(argv):
        return _call(main, argv, leave_at_once=True)

    return wrapped
