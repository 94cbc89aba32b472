"""scripts/prepare_device.sh needs nothing outside the checkout: data archives are named on its command line (a bad
one refused in one line before anything is downloaded or built), and HAPT's archive is staged under the one name
scripts/device_sweep.sh converts, whatever its kind."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_device.sh"


@pytest.fixture
def checkout(tmp_path):
    """A checkout holding the script alone, wheels already staged (so nothing is downloaded)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts")
    (root / ".whl").mkdir()
    (root / ".whl" / "staged-0-py3-none-any.whl").write_text("")
    return root


def prepare(checkout, *args):
    env = dict(os.environ, PYTHON="true")  # the kernel build and DSADS's conversion do nothing here
    return subprocess.run(["bash", str(checkout / "scripts" / "prepare_device.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("arg, message", [
    ("hapt", "prepare_device.sh: hapt: name its archive, hapt=PATH"),
    ("hapt=missing.zip", "prepare_device.sh: hapt=missing.zip: no such file"),
    ("wisdm=x.zip", "prepare_device.sh: unknown dataset 'wisdm'; choose hapt, cifar10 or dsads"),
])
def test_a_bad_argument_is_refused_in_one_line(checkout, arg, message):
    done = prepare(checkout, arg)
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, message, "")


def test_the_hapt_archive_is_staged_under_the_name_device_sweep_converts(checkout, tmp_path):
    (tmp_path / "hapt_uci.zip").write_text("zip")
    (tmp_path / "hapt_raw.tar.xz").write_text("tar")
    (tmp_path / "cifar10_jpg.tar.xz").write_text("jpg")
    assert prepare(checkout, f"hapt={tmp_path}/hapt_uci.zip", f"cifar10={tmp_path}/cifar10_jpg.tar.xz").returncode == 0
    assert sorted(p.name for p in (checkout / ".device_data").iterdir()) == ["cifar10_jpg.tar.xz", "hapt_raw.zip"]
    assert prepare(checkout, f"hapt={tmp_path}/hapt_raw.tar.xz").returncode == 0  # another archive replaces it
    staged = sorted((checkout / ".device_data").glob("hapt_raw.*"))
    assert [(p.name, p.read_text()) for p in staged] == [("hapt_raw.tar.xz", "tar")]
