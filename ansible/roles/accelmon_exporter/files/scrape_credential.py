"""Make the scrape credential on the controller, once: a random password and its bcrypt hash, each in a file.

    python scrape_credential.py DIR

Writes DIR/scrape-password (what Prometheus sends) and DIR/scrape-password.bcrypt (what the exporters' web config
holds), mode 0600, unless both are there already: a second deploy reuses them, so nothing changes on any host.
Prints "created" or "kept". The hash is made here, once, because a bcrypt hash has a random salt: hashing again
at each deploy would rewrite every worker's web config and restart its exporters.
"""

from __future__ import annotations

import os
import secrets
import sys

# Cost 12, exporter-toolkit's documented example (htpasswd -nBC 12); both exporters remember a checked password.
ROUNDS = 12


def write_private(path: str, text: str) -> None:
    """Written whole or not at all (a temporary file renamed), readable by the controller's user alone."""
    temporary = f"{path}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as stream:
        stream.write(text)
    os.replace(temporary, path)


def main(directory: str) -> int:
    password_file = os.path.join(directory, "scrape-password")
    hash_file = password_file + ".bcrypt"
    if os.path.exists(password_file) and os.path.exists(hash_file):
        print("kept")
        return 0
    try:
        import bcrypt
    except ImportError:
        print("the controller needs the bcrypt package to make the scrape credential (pip install bcrypt)")
        return 1
    password = secrets.token_urlsafe(32)  # 43 characters, well under bcrypt's 72 bytes
    hashed = bcrypt.hashpw(password.encode("ascii"), bcrypt.gensalt(ROUNDS)).decode("ascii")
    # The hash first: a run killed between the two leaves no password without its hash.
    write_private(hash_file, hashed + "\n")
    write_private(password_file, password + "\n")
    print("created")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
