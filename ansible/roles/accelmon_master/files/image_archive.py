"""Prints what the master role needs to know of a container image archive: its sha256, and each image it holds
by name with the image's ID, as JSON.

The archives are what `podman save` and `docker save` write: a docker-archive (manifest.json: each image's
RepoTags and its Config, the file of the image's configuration) or an OCI archive (index.json: each manifest's
name in the annotations org.opencontainers.image.ref.name, which podman writes, or io.containerd.image.name,
which docker writes; the manifest's config descriptor). An image's ID, as `podman images` and `docker images`
show it, is the sha256 of that configuration, so the role compares it with the ID of the image on the host and
loads nothing that is there already.

Names are compared as the engines resolve them: docker writes Docker Hub's images without `docker.io/` (and its
official ones without `library/`), so both forms are reduced to the short one.

Usage: image_archive.py ARCHIVE  ->  {"sha256": HEX, "images": {NAME: ID}} or {"error": WHY}. The controller's
Python, standard library only; the archive is read, never unpacked.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from typing import IO, Any

# A manifest or index is a few KB; anything far larger is not one (a hostile or broken archive is refused,
# not read into memory).
MAX_JSON_BYTES = 4 * 1024 * 1024


def short_name(name: str) -> str:
    """An image's name as docker writes it: docker.io/library/x:1 and docker.io/prom/x:1 are x:1 and prom/x:1."""
    if name.startswith("docker.io/"):
        name = name[len("docker.io/") :]
        if name.startswith("library/"):
            name = name[len("library/") :]
    return name


def _json(archive: tarfile.TarFile, member: str) -> Any:
    info = archive.getmember(member)
    if not info.isfile() or info.size > MAX_JSON_BYTES:
        raise ValueError(f"{member} is not a JSON file of an image archive")
    stream: IO[bytes] | None = archive.extractfile(info)
    assert stream is not None
    return json.loads(stream.read())


def _blob(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def images(archive: tarfile.TarFile) -> dict[str, str]:
    """Each image the archive holds: its short name -> its ID (the hex sha256 of its configuration)."""
    names = set(archive.getnames())
    found: dict[str, str] = {}
    if "manifest.json" in names:  # docker-archive; docker 25+ writes it beside an OCI layout too
        for entry in _json(archive, "manifest.json"):
            # podman: "<hex>.json"; docker 25+: "blobs/sha256/<hex>"
            image_id = str(entry["Config"]).rsplit("/", 1)[-1].removesuffix(".json")
            for tag in entry.get("RepoTags") or []:
                found[short_name(tag)] = image_id
    elif "index.json" in names:
        for descriptor in _json(archive, "index.json").get("manifests", []):
            annotations = descriptor.get("annotations") or {}
            name = annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name")
            if not name:
                continue
            manifest = _json(archive, _blob(descriptor["digest"]))
            found[short_name(name)] = manifest["config"]["digest"].partition(":")[2]
    return found


def describe(path: str) -> dict[str, Any]:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        with tarfile.open(path) as archive:
            return {"sha256": digest.hexdigest(), "images": images(archive)}
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError, AttributeError) as error:
        return {"error": f"{type(error).__name__}: {error}"}


if __name__ == "__main__":
    print(json.dumps(describe(sys.argv[1])))
