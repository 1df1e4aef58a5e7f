"""ruamel.yaml set up for editing a person's YAML file in place: comments, key order and quoting kept, long lines
never re-wrapped, and the file's own indentation (mapping, sequence and dash offset, guessed from its text) used
for what is written back.  Shared by tune's ``--write-back`` (writeback.py) and upgrade's inventory edit
(inventory_versions.py), so both rewrite a file the same way."""

from __future__ import annotations

from ruamel.yaml import YAML
from ruamel.yaml.util import load_yaml_guess_indent


def loader() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long lines
    return yaml


def editor(text: str) -> YAML:
    """A round-trip loader and dumper that writes with the indentation ``text`` uses (2 when it has none)."""
    yaml = loader()
    if text.strip():
        _, indent, block_seq_indent = load_yaml_guess_indent(text)
        sequence, offset = indent or 2, block_seq_indent or 0
        yaml.indent(mapping=max(2, sequence - offset), sequence=sequence, offset=offset)
    return yaml
