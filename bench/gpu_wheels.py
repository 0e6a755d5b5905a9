"""The wheels bench/gpu_check.py carries to the lent GPU machine, and a stand-in for that machine's image.

    python bench/gpu_wheels.py download [--dest .whl]   # from PyPI, for the GPU machine (x86-64, cp312)
    python bench/gpu_wheels.py pack [--dest DIR]        # offline: repack this venv's copies (the rehearsal)
    python bench/gpu_wheels.py image-site DIR           # this venv's copies of the image's packages only

The GPU machine (the device tool's README and KINDS.md) runs its image's python3 with its own packages
(torch, transformers, peft, safetensors, accelerate, pyyaml, fsspec, triton, ...) and reaches nothing
outside: what ftorch needs beyond them travels as wheels in the working tree (64 MiB in all with the
repository). `CARRY` is that list: pydantic (trainer/config.py) and its three helpers, tenacity (the run
store's retries); liger-kernel for
the `liger_fused_ce` rows (pure Python over Triton). Not carried: flash-attn (its wheels are hundreds of MB,
built per torch and CUDA) and bitsandbytes (about 60 MB for CUDA: with the repository over the limit), so
their rows say so. `IMAGE_FILE` is KINDS.md's package list of the image, as read on 2026-11-17.

On the machine: `python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD`, then `python3 bench/gpu_check.py`.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGE_FILE = HERE / "gpu_image_packages.txt"
#: what the image lacks and bench/gpu_check.py needs (distribution names)
CARRY = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "tenacity", "liger-kernel")
#: what a carried wheel may be missing here (not installed in this venv): the rehearsal goes without it
OPTIONAL = ("liger-kernel",)
#: how the machine installs them (the device tool's README): `python3 INSTALL_ARGS /tmp/site .whl/*.whl`
INSTALL_ARGS = ("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                "--upgrade", "--target")  # fmt: skip
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    return {
        norm(line.strip()) for line in IMAGE_FILE.read_text().splitlines() if line.strip() and line[0] != "#"
    }


def installed(name: str) -> md.Distribution | None:
    try:
        return md.distribution(name)
    except md.PackageNotFoundError:
        return None


def download(dest: Path) -> list[str]:
    """pip download of each carried wheel, at the version installed here, for the GPU machine."""
    dest.mkdir(parents=True, exist_ok=True)
    got = []
    for name in CARRY:
        dist = installed(name)
        pin = f"{name}=={dist.version}" if dist else name
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *platforms, "-d", str(dest), pin]  # fmt: skip
        subprocess.run(cmd, check=True)
        got.append(pin)
    return got


def pack(dest: Path) -> list[Path]:
    """Each carried distribution installed here, repacked as a wheel from its installed files (offline:
    what the suite's rehearsal carries; the same packages as `download`'s, built for this machine)."""
    dest.mkdir(parents=True, exist_ok=True)
    wheels = []
    for name in CARRY:
        dist = installed(name)
        if dist is None:
            if name in OPTIONAL:
                continue
            raise SystemExit(f"{name} is not installed here: pip install {name}")
        info = next(f for f in dist.files or [] if f.name == "WHEEL")
        tag = next(
            line.split(":", 1)[1].strip()
            for line in Path(dist.locate_file(info)).read_text().splitlines()
            if line.startswith("Tag:")
        )
        path = dest / f"{norm(name).replace('-', '_')}-{dist.version}-{tag}.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
            for f in dist.files or []:
                source = Path(dist.locate_file(f))
                if f.parts[0] == ".." or "__pycache__" in f.parts or not source.is_file():
                    continue  # scripts outside the site, byte code
                whl.write(source, str(f))
        wheels.append(path)
    return wheels


def image_site(dest: Path) -> int:
    """A folder of links to this venv's copies of the image's packages and what they need (their
    requirements, as installed here), less what is carried: the image as far as this machine can stand
    in for it. Returns the number of distributions linked."""
    from packaging.requirements import Requirement

    dists = {norm(d.metadata["Name"]): d for d in md.distributions()}
    carried = {norm(n) for n in CARRY}
    todo = [n for n in image_packages() if n in dists]
    keep: set[str] = set()
    while todo:
        name = todo.pop()
        if name in keep or name in carried:
            continue
        keep.add(name)
        for text in dists[name].requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if norm(req.name) in dists:
                todo.append(norm(req.name))
    dest.mkdir(parents=True, exist_ok=True)
    for name in keep:
        dist = dists[name]
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}:
            source, link = Path(dist.locate_file(top)), dest / top
            if source.exists() and not link.exists() and top != "__pycache__" and not top.endswith(".pth"):
                os.symlink(source, link)
    return len(keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["download", "pack", "image-site"])
    parser.add_argument("dest", nargs="?", default=None)
    parser.add_argument("--dest", dest="dest_opt", default=None)
    args = parser.parse_args(argv)
    dest = Path(args.dest_opt or args.dest or (".whl" if args.action != "image-site" else "image-site"))
    if args.action == "download":
        print("\n".join(download(dest)))
    elif args.action == "pack":
        print("\n".join(str(p) for p in pack(dest)))
    else:
        print(f"{image_site(dest)} distributions linked in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
