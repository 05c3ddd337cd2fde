"""dcgm-exporter's names and units from a sample; fields a GPU does not report are left out."""

from prometheus_client.parser import text_string_to_metric_families

from shared.contracts import dcgm
from shared.contracts.messages import GpuSample, NodeMetrics

MIB = 2**20


def exposition(node: NodeMetrics, holder=lambda _n, _g: "", owner=None) -> str:
    return dcgm.exposition(dcgm.families([node], holder, owner)).decode()


def scrape(node: NodeMetrics, holder=lambda _n, _g: "", owner=None) -> dict:
    return {f.name: f.samples for f in text_string_to_metric_families(exposition(node, holder, owner))}


def test_units_labels_and_left_out_fields():
    gpu = GpuSample(
        index=3,
        memory_used_bytes=3 * 1024 * MIB,
        memory_total_bytes=4 * 1024 * MIB,
        util_pct=70.0,
        uuid="GPU-abc",
        name="NVIDIA H200",
        pci_bus_id="00000000:18:00.0",
        power_w=350.5,
        energy_mj=12345,
        last_xid=79,
        sm_clock_mhz=1980.0,
        driver_version="570.124.06",
    )
    got = scrape(NodeMetrics(node="n1", ts=0.0, gpus=[gpu]), holder=lambda n, g: "j1")
    used = got["DCGM_FI_DEV_FB_USED"][0]
    assert used.value == 3072 and got["DCGM_FI_DEV_FB_FREE"][0].value == 1024
    assert used.labels == {
        "gpu": "3",
        "UUID": "GPU-abc",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia3",
        "modelName": "NVIDIA H200",
        "Hostname": "n1",
        "DCGM_FI_DRIVER_VERSION": "570.124.06",
        "hpc_job": "j1",
    }
    assert got["DCGM_FI_DEV_POWER_USAGE"][0].value == 350.5
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0].value == 12345
    assert got["DCGM_FI_DEV_XID_ERRORS"][0].value == 79 and got["DCGM_FI_DEV_SM_CLOCK"][0].value == 1980
    assert got["DCGM_FI_DEV_GPU_TEMP"] == [] and got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == []  # not reported


def test_process_memory_is_summed_per_adc_job():
    gpu = GpuSample(index=0, memory_used_bytes=0, memory_total_bytes=1, process_memory_bytes={10: 100, 11: 50, 99: 7})
    got = scrape(NodeMetrics(node="n1", ts=0.0, gpus=[gpu]), owner=lambda _n, pid: "j1" if pid in (10, 11) else None)
    held = {s.labels["hpc_job"]: s.value for s in got[dcgm.JOB_MEMORY]}
    assert held == {"j1": 150, "(not ADC)": 7}


def test_every_family_is_named_even_without_samples():
    got = scrape(NodeMetrics(node="n1", ts=0.0))
    assert set(dcgm.NAMES) <= set(got)


def test_types_and_names_are_dcgm_exporters():
    """Counters are typed as counters under their exact names (no `_total` added), gauges as gauges."""
    gpu = GpuSample(index=0, memory_used_bytes=1, memory_total_bytes=2, energy_mj=5, pcie_replay=2)
    types = {
        line.split()[2]: line.split()[3]
        for line in exposition(NodeMetrics(node="n1", ts=0.0, gpus=[gpu])).splitlines()
        if line.startswith("# TYPE ")
    }
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert types["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "counter"
    assert types["DCGM_FI_DEV_FB_USED"] == "gauge" and types["DCGM_FI_DEV_XID_ERRORS"] == "gauge"
    text = exposition(NodeMetrics(node="n1", ts=0.0, gpus=[gpu]))
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text and "CONSUMPTION_total" not in text
