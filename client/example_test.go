package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/bus"
	"github.com/poolplanner/poolplanner/internal/inventory"
	"github.com/poolplanner/poolplanner/internal/service"
	"github.com/poolplanner/poolplanner/internal/store"
)

// A launcher on node gpu-0 follows its own node's workers: the latest
// assignment at once, then each change (an empty list when the node loses
// them all). It costs only this node's changes, whatever the cluster's
// size.
func Example_launcher() {
	url, stop := exampleCluster() // a server, two 4-GPU nodes and a planner
	defer stop()

	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	updates, err := c.FollowNode(ctx, "default", "gpu-0")
	if err != nil {
		log.Fatal(err)
	}
	for a := range updates {
		fmt.Printf("revision %d: %d workers on %s\n", a.Revision, len(a.Workers), a.NodeID)
		for _, w := range a.Workers {
			// Start (or keep) the worker; stop those no longer listed.
			fmt.Printf("  %s %d: CUDA_VISIBLE_DEVICES=%q\n", w.Component, w.Index, w.CUDAVisibleDevices)
		}
		cancel() // a launcher keeps ranging; the example stops after the first
	}
	// Output:
	// revision 1: 3 workers on gpu-0
	//   train 0: CUDA_VISIBLE_DEVICES="GPU-157dc2ac-d260-46a3-82d3-798a1fae6a88"
	//   train 1: CUDA_VISIBLE_DEVICES="GPU-157dc2ac-d260-46a3-82d3-798a1fae6a88"
	//   buffer 0: CUDA_VISIBLE_DEVICES=""
}

// exampleCluster starts what `planner serve --simulate` would: an
// embedded NATS server, simulated nodes in the inventory bucket and a
// planner, and waits for the first plan.
func exampleCluster() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "poolplanner-example")
	if err != nil {
		log.Fatal(err)
	}
	ns, url, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	sim, _ := inventory.ParseSimulation("4xH100")
	for _, id := range []string{"gpu-0", "gpu-1"} {
		inv := inventory.Facts{NodeID: id, Hostname: id, IP: "10.0.0.1", CPUs: 64}.Inventory()
		inv.GPUs = inventory.SimulatedGPUs(id, sim)
		doc, _ := json.Marshal(inv)
		if _, err := store.NewInventoryStore(js).Put(ctx, id, doc, false, time.Hour); err != nil {
			log.Fatal(err)
		}
	}
	spec := []byte(`
scheduling:
  train:  {worker_num: 2, num_cpus: 1, num_gpus: 0.5}
  eval:   {worker_num: 1, num_cpus: 1, num_gpus: 4}
  buffer: {worker_num: auto, num_cpus: 1, num_gpus: 0}
placement: {mode: auto, strategy: disaggregate, env_strategy: default}
`)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = service.New(service.Config{NC: nc, JS: js, Spec: spec, Log: zerolog.Nop()}).Run(ctx)
	}()
	c, _ := client.New(nc)
	for {
		if _, err := c.Plan(ctx, "default", 0); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return url, func() {
		cancel()
		<-done
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}
