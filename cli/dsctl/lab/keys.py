"""SSH keys of the lab: the controller's client key and one host key per lab host."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def write_ed25519_keypair(private_path: Path, comment: str) -> str:
    """Write an OpenSSH ed25519 key pair (private 0600, ``.pub`` beside it); return the public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public_line = f"{public.decode()} {comment}"
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    private_path.with_name(private_path.name + ".pub").write_text(public_line + "\n")
    return public_line


def public_line(private_path: Path) -> str:
    return private_path.with_name(private_path.name + ".pub").read_text().strip()


def known_hosts_line(address: str, host_public_line: str) -> str:
    key_type, key_b64 = host_public_line.split()[:2]
    return f"{address} {key_type} {key_b64}"
