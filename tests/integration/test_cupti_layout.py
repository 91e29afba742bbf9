"""The CUPTI record layouts tracer/recorder/csrc/cupti.c reads, against NVIDIA's own headers:
a program compiled here against every CUPTI header set this interpreter's packages hold prints
each field's offset, in the oldest record version the module claims and the newest the headers
define, and each constant it uses. The pinned CPU build of torch has no headers; the
compatibility venvs (CUDA builds: CUPTI 12.8 and 13.0 headers) run it (scripts/compat.sh)."""
from __future__ import annotations

import subprocess
import sysconfig

import pytest

from support.cupti_headers import header_sets, newest

cupti = pytest.importorskip("tracer.recorder._cupti",
                            reason="the _cupti extension is not built (no compiler)")


def compiled_offsets(header_dir: str, includes: list, tmp_path) -> list:
    """What the headers say, as (key, version, value): each field's offset in the oldest
    record version the module claims and in the newest the headers define, and each constant
    it uses."""
    layout = cupti.layout()
    lines = []
    for key in layout:
        if "." not in key:
            continue
        struct_name, field = key.split(".")
        versions = {"CUpti_ActivityKernel": ("CUpti_ActivityKernel4",),
                    "CUpti_ActivityMemcpy": ("CUpti_ActivityMemcpy",),
                    "CUpti_ActivityMemset": ("CUpti_ActivityMemset",),
                    "CUpti_ActivityAPI": ("CUpti_ActivityAPI",)}[struct_name]
        for version in versions + (newest(header_dir, struct_name),):
            lines.append(f'printf("{key} {version} %zu\\n", offsetof({version}, {field}));')
    lines += [f'printf("{c} - %lld\\n", (long long){c});' for c in layout if "." not in c]
    source = tmp_path / "layout.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <cupti.h>\n"
                      "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    binary = tmp_path / "layout"
    cc = sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc"
    built = subprocess.run([cc, *[f"-I{d}" for d in includes], str(source), "-o", str(binary)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def test_the_record_layouts_read_are_cuptis_own(tmp_path):
    sets = header_sets()
    if not sets:
        pytest.skip("no CUPTI headers in this interpreter's packages (a CPU build of torch); "
                    "scripts/compat.sh runs this in CUDA builds' venvs")
    layout = cupti.layout()
    for header_dir, includes in sets:
        checked = 0
        for key, version, value in compiled_offsets(header_dir, includes, tmp_path):
            assert layout[key] == int(value), (header_dir, key, version)
            checked += 1
        # every field in two versions (the oldest claimed and the newest) and each constant
        assert checked == 2 * len([k for k in layout if "." in k]) + \
            len([k for k in layout if "." not in k])
