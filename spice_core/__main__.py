import atexit
import os
import sys


def _exit(code: int) -> None:
    if code in (130, 143):
        # Interrupted (Ctrl-C) or terminated (SIGTERM). A Ctrl-C that lands while a C extension runs Python code
        # (torch's import does) leaves Python about to re-kill itself with SIGINT as it exits (status -2, as if
        # nothing had caught it), and a stopped run need not wait for worker threads: finish here: run the exit
        # handlers, flush, and exit with the status shells expect.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


try:
    from spice_core.tools.cli import main, unwind_on_sigterm
except KeyboardInterrupt:       # Ctrl-C while the tools are still importing
    print("interrupted", file=sys.stderr)
    _exit(130)

unwind_on_sigterm()
_exit(main())
