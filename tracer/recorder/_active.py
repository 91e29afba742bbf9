"""The recording session active in this process, if any (kept apart so that importing tracer to
read traces, or calling annotate() with no trace, never imports torch's machinery)."""
ACTIVE = None
