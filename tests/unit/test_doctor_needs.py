"""What a failed doctor check blocks comes from the classes' `host_needs`: every need a fault family or probe
declares is one of doctor's checks, and the check lists exactly the types that declare it."""

from __future__ import annotations

from chaoskit import doctor
from chaoskit.injectors import INJECTORS
from chaoskit.probes import PROBES


def test_every_declared_need_is_a_doctor_check():
    declared = {(c.type, n) for c in (*INJECTORS, *PROBES) for n in c.host_needs}
    assert declared and [(t, n) for t, n in sorted(declared) if n not in doctor.NEEDS] == []


def test_a_check_blocks_the_types_that_declare_it():
    assert doctor.blocked("nftables") == ("network.drop", "network.partition")
    assert doctor.blocked("kmsg") == ("gpu.xid", "kernel_log probe")
    for need in doctor.NEEDS:
        want = {c.type for c in INJECTORS if need in c.host_needs} | {f"{c.type} probe" for c in PROBES
                                                                       if need in c.host_needs}
        assert set(doctor.blocked(need)) == want and want, need


def test_every_need_says_what_provides_it():
    """The prerequisites page (scripts/gen_reference.py) is generated from doctor.NEED_LIST: each need names only
    known requirements, and every requirement doctor can report missing belongs to some need."""
    named = {r for n in doctor.NEED_LIST for r in n.requirements}
    assert named - set(doctor.REQUIREMENTS) == set()
    assert set(doctor.REQUIREMENTS) - named == set()
    assert len(doctor.NEEDS) == len(set(doctor.NEEDS)) and all(n.what for n in doctor.NEED_LIST)
