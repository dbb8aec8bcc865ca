"""Horovod settings the runtime cannot run are refused by name before ``hvd.init``, not a crash.

No MPI here: a pytest process that started MPI makes every ``mpirun`` the later tests launch fail.
"""
import pytest

from hybrid.runtime.launch_facts import check_horovod_settings


@pytest.mark.parametrize("name", ["HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"])
@pytest.mark.parametrize("value", ["gloo", "GLOO", " gloo "])
def test_gloo_is_refused_naming_the_variable_to_unset(name, value):
    with pytest.raises(ValueError, match=f"{name}=gloo cannot run here: .*; unset {name}"):
        check_horovod_settings({name: value})


@pytest.mark.parametrize("environ", [{}, {"HOROVOD_CPU_OPERATIONS": "mpi"}, {"HOROVOD_CONTROLLER": "mpi"},
                                     {"HOROVOD_CPU_OPERATIONS": "", "HOROVOD_CYCLE_TIME": "10"}])
def test_mpi_and_unset_pass(environ):
    check_horovod_settings(environ)
