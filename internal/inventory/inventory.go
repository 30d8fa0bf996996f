// Package inventory describes what a node offers the planner: its GPUs,
// CPUs and address, discovered with NVML, simulated, or read from a file.
package inventory

import "time"

// GPU is one device of a node as the reporter saw it.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	PCIBusID    string `json:"pci_bus_id"`
	Healthy     bool   `json:"healthy"`
}

// NodeInventory is the document a reporter keeps in the inventory bucket,
// one per node id. Field names are fixed by the outside contract.
type NodeInventory struct {
	NodeID        string            `json:"node_id"`
	Hostname      string            `json:"hostname"`
	IP            string            `json:"ip"`
	CPUs          int               `json:"cpus"`
	MemoryBytes   uint64            `json:"memory_bytes"`
	GPUs          []GPU             `json:"gpus"`
	Labels        map[string]string `json:"labels,omitempty"`
	DriverVersion string            `json:"driver_version"`
	ReportedAt    time.Time         `json:"reported_at"`
}
