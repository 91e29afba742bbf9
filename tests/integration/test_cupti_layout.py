"""The CUPTI record layouts tracer/recorder/csrc/cupti/cupti.c reads, against NVIDIA's own headers:
a program compiled here against every CUPTI header set found (tests/support/cupti_headers.py:
the interpreter's packages, a toolkit under /usr/local, ``PARATRACE_CUPTI_HEADERS``) prints each
field's offset, in the oldest record version the module claims and the newest the headers
define, and each constant it uses; and the same for the records the stand-in libcupti hands the
module (tests/support/cupti_records.py: every field, each struct's size, the callback ids). The
pinned CPU build of torch has no headers; the compatibility venvs (CUDA builds: CUPTI 12.8 and
13.0 headers) run it (scripts/compat.sh), and docs/gpu.md says how to add a version's."""
from __future__ import annotations

import subprocess
import sysconfig

import pytest

from support import cupti_records as rec
from support.cupti_headers import api_version, header_sets, newest

cupti = pytest.importorskip("tracer.recorder._cupti",
                            reason="the _cupti extension is not built (no compiler)")


def compiled(lines: list, includes: list, tmp_path) -> list:
    """The printf lines, compiled against the headers and run: their output, split."""
    source = tmp_path / "layout.c"
    # only the headers that define what is read: cupti.h pulls in every API's, which want the
    # cuda.h of their own release
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <cupti_activity.h>\n"
                      "#include <cupti_runtime_cbid.h>\n#include <cupti_driver_cbid.h>\n"
                      "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    binary = tmp_path / "layout"
    cc = sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc"
    built = subprocess.run([cc, *[f"-I{d}" for d in includes], str(source), "-o", str(binary)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def module_lines(header_dir: str) -> list:
    """What the module reads: each field's offset in the oldest record version it claims and
    in the newest the headers define, and each constant."""
    layout = cupti.layout()
    lines = []
    for key in layout:
        if "." not in key:
            continue
        struct_name, field = key.split(".")
        oldest = {"CUpti_ActivityKernel": "CUpti_ActivityKernel4"}.get(struct_name, struct_name)
        for version in (oldest, newest(header_dir, struct_name)):
            lines.append(f'printf("{key} {version} %zu\\n", offsetof({version}, {field}));')
    return lines + [f'printf("{c} - %lld\\n", (long long){c});' for c in layout if "." not in c]


def test_the_record_layouts_read_are_cuptis_own(tmp_path):
    sets = header_sets()
    if not sets:
        pytest.skip("no CUPTI headers on this machine (a CPU build of torch); "
                    "scripts/compat.sh runs this in CUDA builds' venvs")
    layout = cupti.layout()
    for header_dir, includes in sets:
        checked = 0
        for key, version, value in compiled(module_lines(header_dir), includes, tmp_path):
            assert layout[key] == int(value), (header_dir, key, version)
            checked += 1
        # every field in two versions (the oldest claimed and the newest) and each constant
        assert checked == 2 * len([k for k in layout if "." in k]) + \
            len([k for k in layout if "." not in k])
        print(f"{header_dir}: CUPTI {api_version(header_dir)}, {checked} offsets and constants")


def test_the_stand_ins_records_and_ids_are_nvidias(tmp_path):
    sets = header_sets()
    if not sets:
        pytest.skip("no CUPTI headers on this machine (a CPU build of torch)")
    lines = []
    for name, fields in rec.LAYOUTS:
        lines += [f'printf("{name} {f} %zu\\n", offsetof({name}, {f}));' for f, _ in fields]
        lines.append(f'printf("{name} sizeof %zu\\n", sizeof({name}));')
    lines += [f'printf("{c} - %lld\\n", (long long){c});' for c in rec.CONSTANTS]
    for (domain, call), _ in rec.CALLS.items():
        prefix = "CUPTI_RUNTIME_TRACE_CBID_" if domain == rec.RUNTIME else \
            "CUPTI_DRIVER_TRACE_CBID_"
        lines.append(f'printf("{call} - %d\\n", (int){prefix}{call});')
    expected = {(name, f): rec.offsets((name, fields))[f] for name, fields in rec.LAYOUTS
                for f, _ in fields}
    expected.update({(name, "sizeof"): rec.size((name, fields)) for name, fields in rec.LAYOUTS})
    expected.update({(c, "-"): v for c, v in rec.CONSTANTS.items()})
    expected.update({(call, "-"): cbid for (_, call), cbid in rec.CALLS.items()})
    for header_dir, includes in sets:
        got = {(a, b): int(v) for a, b, v in compiled(lines, includes, tmp_path)}
        assert got == expected, header_dir
