"""scripts/bench_decoding.py --against REV: the decoder of a git revision loads beside this checkout's, as its own
package, and decodes what this checkout's decoder decodes."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _has_history() -> bool:
    if shutil.which("git") is None:
        return False
    r = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD", "i2d2/decoding/"],
                       capture_output=True, text=True)
    return r.returncode == 0 and "i2d2/decoding/neurologic.py" in r.stdout.split()


@pytest.mark.skipif(not _has_history(), reason="needs the project's git history")
def test_decoder_at_a_revision_loads_as_its_own_package(tiny_gpt2, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_decoding as bd

    from i2d2 import decoding

    old = bd.decoder_at("HEAD")
    assert old.__name__ == "_decoding_at_HEAD" and old.NeuroLogicDecoder is not decoding.NeuroLogicDecoder
    assert Path(old.__file__).parent != Path(decoding.__file__).parent
    model, tok = tiny_gpt2
    prompts, sets = bd.i2d2_sets(2)
    cfg = dict(beam_size=3, num_return=2, max_new_tokens=6, batch_size=2)
    gens = old.NeuroLogicDecoder(model, tok, cfg).decode(prompts, [c.to_dict() for c in sets])
    assert [len(g) for g in gens] == [2, 2] and all(isinstance(x.text, str) for g in gens for x in g)
    with pytest.raises(SystemExit, match="no i2d2/decoding/"):
        bd.decoder_at("HEAD:README.md")  # not a revision holding the package
