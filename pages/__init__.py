"""The web app's pages, one module per page, plus what they share.

- `chat`: the main page (chat, controls, live panels); `trace_explorer`, `sweep`, `about`.
- `common` (app context, settings parsing, exports), `runner` (one generation at a time on a
  pump thread), `live` (running numbers), `figures` (plotly JSON), `messages` (chat text).

Pages talk to the engine only through `spice_core.api` and get it from `app.py` as an argument,
so tests can pass a fake engine.
"""
