"""viz.analysis.callgraphs.source_files.RecordedSources: a recorded file's text is shown only
when the file here has the recorded content, and what the recording says of where it lay is
read as data, whatever its JSON type."""
from __future__ import annotations

import hashlib

from viz.analysis.callgraphs.source_files import RecordedSources


def _sources(path, data: bytes, **entry) -> RecordedSources:
    digest = hashlib.sha256(data).hexdigest()
    return RecordedSources([{"sources": {str(path): {"sha256": digest, "size": len(data),
                                                     **entry}}}])


def test_a_matching_file_is_shown_with_the_root_it_lay_under(tmp_path):
    source = tmp_path / "model.py"
    source.write_bytes(b"def f():\n    return 1\n")
    text = _sources(source, source.read_bytes(), root="cwd", under=str(tmp_path)).text(str(source))
    assert text.lines == ["def f():", "    return 1"]
    assert text.where == f"the run's working directory {tmp_path}, as model.py"


def test_a_root_that_is_not_text_is_no_root_and_no_traceback(tmp_path):
    """A trace's ``root`` that is a JSON list or object (a damaged or crafted trace) used to
    raise TypeError (unhashable) from the report; the text is shown, with no root named."""
    source = tmp_path / "model.py"
    source.write_bytes(b"x = 1\n")
    for root in (["cwd"], {"cwd": 1}):
        text = _sources(source, source.read_bytes(), root=root).text(str(source))
        assert text.lines == ["x = 1"] and text.where == ""
