"""Parsers (and, for the lab, renderers) of what real Ascend hosts print and write: npu-smi output, the
installers' version files, the raw facts a host reports. The lab's emulators import these, never the reverse."""
