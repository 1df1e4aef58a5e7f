"""dsctl.core.ansible_values.plain on the values Ansible really hands a filter (its tagged, lazy types)."""

from __future__ import annotations

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from dsctl.core.ansible_values import plain


def test_templated_values_become_exact_builtins():
    templar = Templar(loader=DataLoader(), variables={"port": 8000, "names": ["a", "b"], "ratio": 0.5})
    raw = {key: trust_as_template(text) for key, text in
           {"port": "{{ port }}", "names": "{{ names }}", "ratio": "{{ ratio }}", "label": "{{ names[0] }}-x"}.items()}
    raw[1] = (trust_as_template("t"), True, None)
    found = plain(templar.template(raw))
    assert found == {"port": 8000, "names": ["a", "b"], "ratio": 0.5, "label": "a-x", "1": ["t", True, None]}
    assert [type(found[key]) for key in ("port", "names", "ratio", "label", "1")] == [int, list, float, str, list]
    assert type(found["names"][0]) is str and type(found["1"][1]) is bool
    assert type(found["1"][0]) is str  # Ansible hands the trusted literal over as its tagged str subclass


def test_subclasses_lose_their_type_and_other_objects_pass_through():
    class Tagged(str):
        pass

    class Count(int):
        pass

    marker = object()
    found = plain([Tagged("v"), Count(3), marker])
    assert [type(item) for item in found[:2]] == [str, int] and found[2] is marker
