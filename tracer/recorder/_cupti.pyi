"""Types of the C extension tracer.recorder._cupti (csrc/cupti/): CUPTI's activity API without
Kineto, used by device/cupti_direct.py. tests/unit/test_extension_stubs.py holds these names
equal to the module's."""
ROW_BYTES: int
TESTED_VERSIONS: tuple[int, ...]

def load(path: str) -> int:
    """libcupti's calls; returns cuptiGetVersion's."""
def start(buffer_bytes: int, flush_period_ms: int) -> None:
    """Register the buffers, enable the kinds."""
def stop() -> None:
    """Turn off what start turned on (records under way still come)."""
def flush(forced: bool) -> None:
    """cuptiActivityFlushAll, without the GIL."""
def drain(known: int) -> tuple[bytes, list[str], int, int, int]:
    """(rows bytes, names from index known on, rows lost, records CUPTI dropped, buffers not
    this module's) since the last drain."""
def clock() -> tuple[int, int]:
    """(cuptiGetTimestamp, CLOCK_REALTIME) in ns."""
def own_clock() -> bool:
    """Whether CUPTI's clock is CLOCK_REALTIME."""
def take_record(record: bytes) -> None:
    """Tests: one record through the parse."""
def layout() -> dict[str, int]:
    """Tests: the record offsets and constants read."""
def counters() -> dict[str, int]:
    """Tests: buffers out with CUPTI, names demangled, calls enabled one by one."""
def fail_allocations(n: int) -> None:
    """Tests: the records half's allocations past the next n fail."""
