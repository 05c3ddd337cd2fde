"""dcgm-exporter's names and units from a sample; fields a GPU does not report are left out."""
from prometheus_client.parser import text_string_to_metric_families

from shared import dcgm
from shared.messages import GpuSample, NodeMetrics

MIB = 2**20


def scrape(node: NodeMetrics, holder=lambda _n, _g: ("", ""), owner=None) -> dict:
    text = dcgm.exposition(dcgm.families([node], holder, owner)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_units_labels_and_left_out_fields():
    gpu = GpuSample(index=3, memory_used_bytes=3 * 1024 * MIB, memory_total_bytes=4 * 1024 * MIB, util_pct=70.0,
                    uuid="GPU-abc", name="NVIDIA H200", pci_bus_id="00000000:18:00.0", power_w=350.5,
                    energy_mj=12345, last_xid=79, sm_clock_mhz=1980.0)
    got = scrape(NodeMetrics(node="n1", ts=0.0, gpus=[gpu]), holder=lambda n, g: ("j1", "vision"))
    used = got["DCGM_FI_DEV_FB_USED"][0]
    assert used.value == 3072 and got["DCGM_FI_DEV_FB_FREE"][0].value == 1024
    assert used.labels == {"gpu": "3", "UUID": "GPU-abc", "pci_bus_id": "00000000:18:00.0", "device": "nvidia3",
                           "modelName": "NVIDIA H200", "Hostname": "n1", "job": "j1", "team": "vision"}
    assert got["DCGM_FI_DEV_POWER_USAGE"][0].value == 350.5
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0].value == 12345
    assert got["DCGM_FI_DEV_XID_ERRORS"][0].value == 79 and got["DCGM_FI_DEV_SM_CLOCK"][0].value == 1980
    assert got["DCGM_FI_DEV_GPU_TEMP"] == [] and got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == []  # not reported


def test_process_memory_is_summed_per_adc_job():
    gpu = GpuSample(index=0, memory_used_bytes=0, memory_total_bytes=1, process_memory_bytes={10: 100, 11: 50, 99: 7})
    got = scrape(NodeMetrics(node="n1", ts=0.0, gpus=[gpu]), owner=lambda _n, pid: "j1" if pid in (10, 11) else None)
    held = {s.labels["job"]: s.value for s in got[dcgm.JOB_MEMORY]}
    assert held == {"j1": 150, "(not ADC)": 7}


def test_every_family_is_named_even_without_samples():
    got = scrape(NodeMetrics(node="n1", ts=0.0))
    assert set(dcgm.NAMES) <= set(got)
