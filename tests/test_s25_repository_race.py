"""A kernel's folder that another process removes while this one lists it (evicting the
kernel's last entry) holds nothing: the executable is built, never a FileNotFoundError."""
import pathlib
import shutil

import numpy as np

import hetflow
from hetflow.platform.repository import CodeRepository


@hetflow.kernel
def halve(i, x, out):
    out[i] = x[i] / 2


def test_a_kernel_folder_removed_while_it_is_listed_is_built_again(tmp_path, monkeypatch):
    cpu = hetflow.get_device("cpu0")
    first = CodeRepository(tmp_path).executable(halve, cpu, 1, {})
    folder = pathlib.Path(first.path).parent
    glob, vanished = pathlib.Path.glob, []

    def vanishing(self, pattern):
        if self == folder and not vanished:  # glob saw the folder; the evictor removes it now
            vanished.append(folder)
            shutil.rmtree(folder)
            raise FileNotFoundError(2, "No such file or directory", str(folder))
        return glob(self, pattern)

    monkeypatch.setattr(pathlib.Path, "glob", vanishing)
    repo = CodeRepository(tmp_path)  # another process's
    exe = repo.executable(halve, cpu, 1, {})
    assert vanished and repo.compiled == 1 and exe.path == first.path
    x, out = np.arange(6.0), np.zeros(6)
    hetflow.forall(6, halve, x, out, device="cpu0")
    np.testing.assert_array_equal(out, x / 2)
    vanished.clear()
    assert repo.entries() == [] and not folder.exists()   # listing every kernel's folder
