"""GPUSpec survives deepcopy and pickle (issue 30): RLlib deep-copies the pipeline DQN's env config, which
holds the cluster, its GPU and that GPU's spec (a read-only mappingproxy of peaks, which neither copies
nor pickles by itself); the pipeline DQN failed with "cannot pickle 'mappingproxy' object"."""

import copy
import pickle
from types import MappingProxyType

import pytest

from archplace.hardware.gpus import GPUS
from archplace.hardware.presets import V100, v100_servers


@pytest.mark.parametrize("name", sorted(GPUS))
def test_spec_deepcopy_and_pickle_round_trip(name):
    spec = GPUS[name]
    for twin in (copy.deepcopy(spec), pickle.loads(pickle.dumps(spec))):
        assert twin == spec
        assert dict(twin.peak_flops_per_s) == dict(spec.peak_flops_per_s)
        assert isinstance(twin.peak_flops_per_s, MappingProxyType)   # still read-only
        assert twin.peak("fp32") == spec.peak("fp32")


def test_pipeline_cluster_deepcopies():
    cl = v100_servers(2)
    twin = copy.deepcopy(cl)
    assert twin == cl
    assert twin.device.spec.peak("fp16") == V100.spec.peak("fp16") == 125e12
