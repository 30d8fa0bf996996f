#!/usr/bin/env python3
"""Run a poolplanner plan's workers on one node, and follow the plan.

    python3 examples/launcher.py --server URL --node-id N --plan NAME \
        [--creds F] [--planner PATH] [--grace SECONDS] [--wait-free DURATION] -- CMD ARGS...

CMD runs once per worker the plan places on node N, with the environment
`planner exec` sets: CUDA_VISIBLE_DEVICES (the worker's GPU UUIDs),
POOLPLANNER_PLAN, POOLPLANNER_REVISION, POOLPLANNER_COMPONENT,
POOLPLANNER_INDEX, POOLPLANNER_NODE_ID and POOLPLANNER_GPU_SHARE.

The node's assignment is followed with `planner watch --node N --output
json` (one JSON line per revision of the node's workers). On each new one,
the workers taken off the node, or given other GPUs, are stopped first
(SIGTERM, --grace seconds, then SIGKILL) and only then are the new ones
started, so a GPU changes hands only once its old worker is gone; with
--wait-free, each new worker is started through `planner exec
--wait-free`, which also waits until no other process runs on its GPUs.
A worker that exits on its own is started again, with backoff. SIGTERM or
SIGINT stops every worker, then the launcher.

Python 3 standard library only; the `planner` binary does the NATS side.
"""

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

BACKOFF_MIN = 1.0
BACKOFF_MAX = 60.0
# A worker that ran this long before it exited starts again at once.
STABLE_AFTER = 60.0


def log(msg):
    print(f"launcher: {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    if "--" not in argv:
        sys.exit("launcher: usage: launcher.py --server URL --node-id N --plan NAME [--creds F] -- CMD ARGS...")
    i = argv.index("--")
    own, cmd = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="launcher.py", description="Run a poolplanner plan's workers on one node.")
    p.add_argument("--server", default="nats://127.0.0.1:4222", help="NATS URL(s) of the planner service")
    p.add_argument("--node-id", required=True, help="this node's id, as its reporter reports it")
    p.add_argument("--plan", default="default", help="plan name")
    p.add_argument("--creds", help="NATS credentials file (a launcher's)")
    p.add_argument("--planner", default="planner", help="the planner binary (default: planner on PATH)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping a worker")
    p.add_argument("--wait-free", default="", help="start workers through planner exec --wait-free DURATION (wait until their GPUs run no other process)")
    args = p.parse_args(own)
    if not cmd:
        p.error("no CMD after --")
    if args.grace < 0:
        p.error("--grace: must be >= 0")
    args.cmd = cmd
    return args


class Worker:
    """One worker's process: what it was started as, and its restarts."""

    def __init__(self, placed):
        self.placed = placed
        self.proc = None
        self.started = 0.0
        self.backoff = BACKOFF_MIN
        self.next_start = 0.0

    @property
    def key(self):
        return (self.placed["component"], self.placed["index"])

    def same_place(self, placed):
        """Whether placed is this worker where it runs: same GPUs, share."""
        return all(self.placed.get(k) == placed.get(k) for k in ("gpus", "gpu_uuids", "gpu_share", "cuda_visible_devices"))


class Launcher:
    def __init__(self, args):
        self.args = args
        self.workers = {}  # (component, index) -> Worker
        self.events = queue.Queue()
        self.stopping = False
        self.watch = None

    # --- the node's assignment -------------------------------------------
    def watch_cmd(self):
        cmd = [self.args.planner, "watch", "--server", self.args.server, "--plan", self.args.plan,
               "--node", self.args.node_id, "--output", "json"]
        if self.args.creds:
            cmd += ["--creds", self.args.creds]
        return cmd

    def follow(self):
        """Reads assignments from planner watch into the event queue; a
        watch that ends (NATS away, say) is started again with backoff."""
        backoff = BACKOFF_MIN
        while not self.stopping:
            try:
                self.watch = subprocess.Popen(self.watch_cmd(), stdout=subprocess.PIPE, text=True)
            except OSError as e:
                self.events.put(("fatal", f"cannot run {self.args.planner}: {e}"))
                return
            for line in self.watch.stdout:
                line = line.strip()
                if not line:
                    continue
                try:
                    self.events.put(("assignment", json.loads(line)))
                    backoff = BACKOFF_MIN
                except json.JSONDecodeError:
                    log(f"planner watch printed something that is not JSON: {line[:200]}")
            code = self.watch.wait()
            if self.stopping:
                return
            if code == 2:
                self.events.put(("fatal", f"planner watch refused its arguments (exit 2)"))
                return
            log(f"planner watch ended (exit {code}); following again in {backoff:.0f}s")
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    # --- workers -------------------------------------------------------------
    def env(self, placed):
        env = dict(os.environ)
        env.update({
            "CUDA_VISIBLE_DEVICES": placed.get("cuda_visible_devices", ""),
            "POOLPLANNER_PLAN": placed.get("plan", self.args.plan),
            "POOLPLANNER_REVISION": str(placed.get("revision", 0)),
            "POOLPLANNER_COMPONENT": placed["component"],
            "POOLPLANNER_INDEX": str(placed["index"]),
            "POOLPLANNER_NODE_ID": self.args.node_id,
            "POOLPLANNER_GPU_SHARE": format_share(placed.get("gpu_share", 0)),
        })
        return env

    def start(self, w):
        placed = w.placed
        cmd = self.args.cmd
        if self.args.wait_free:
            cmd = [self.args.planner, "exec", str(placed["component"]), str(placed["index"]), "--server", self.args.server,
                   "--plan", self.args.plan, "--node-id", self.args.node_id, "--wait-free", self.args.wait_free]
            if self.args.creds:
                cmd += ["--creds", self.args.creds]
            cmd += ["--"] + self.args.cmd
        try:
            w.proc = subprocess.Popen(cmd, env=self.env(placed), start_new_session=True)
        except OSError as e:
            log(f"{placed['component']} {placed['index']}: cannot start {cmd[0]}: {e}")
            w.proc = None
            w.next_start = time.monotonic() + w.backoff
            w.backoff = min(w.backoff * 2, BACKOFF_MAX)
            return
        w.started = time.monotonic()
        log(f"started {placed['component']} {placed['index']} (revision {placed.get('revision')}, "
            f"CUDA_VISIBLE_DEVICES={placed.get('cuda_visible_devices', '')}): pid {w.proc.pid}")

    def stop(self, ws):
        """Stops workers ws at once: SIGTERM to each process group, the
        grace period for all, SIGKILL to those left; returns when all are
        gone."""
        live = [w for w in ws if w.proc is not None and w.proc.poll() is None]
        for w in live:
            signal_group(w.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.args.grace
        for w in live:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(w.proc, signal.SIGKILL)
                w.proc.wait()
        for w in ws:
            if w.proc is not None:
                # Reap a group leader's children that outlived it.
                signal_group(w.proc, signal.SIGKILL)
                log(f"stopped {w.placed['component']} {w.placed['index']} (pid {w.proc.pid})")
            w.proc = None

    def apply(self, assignment):
        """Moves the node to the assignment: the leaving first, then the
        new."""
        if assignment.get("plan", self.args.plan) != self.args.plan or assignment.get("node_id") != self.args.node_id:
            return
        want = {(p["component"], p["index"]): p for p in assignment.get("workers") or []}
        leaving = [w for k, w in self.workers.items() if k not in want or not w.same_place(want[k])]
        self.stop(leaving)
        for w in leaving:
            del self.workers[w.key]
        for k, placed in want.items():
            if k in self.workers:
                self.workers[k].placed["revision"] = placed.get("revision")
                continue
            w = Worker(placed)
            self.workers[k] = w
            self.start(w)
        log(f"revision {assignment.get('revision')}: {len(want)} workers on {self.args.node_id}")

    def restart_exited(self):
        now = time.monotonic()
        for w in self.workers.values():
            if w.proc is not None and w.proc.poll() is not None:
                code = w.proc.returncode
                # Children it left behind (a server's workers) would keep
                # the GPU from its successor.
                signal_group(w.proc, signal.SIGKILL)
                if now - w.started >= STABLE_AFTER:
                    w.backoff = BACKOFF_MIN
                w.next_start = now + w.backoff
                log(f"{w.placed['component']} {w.placed['index']} exited ({code}); starting again in {w.backoff:.0f}s")
                w.backoff = min(w.backoff * 2, BACKOFF_MAX)
                w.proc = None
            elif w.proc is None and w.next_start and now >= w.next_start:
                w.next_start = 0.0
                self.start(w)

    # --- main loop -----------------------------------------------------------
    def run(self):
        threading.Thread(target=self.follow, daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.events.put(("stop", None)))
        code = 0
        while True:
            try:
                kind, value = self.events.get(timeout=0.5)
            except queue.Empty:
                self.restart_exited()
                continue
            if kind == "assignment":
                self.apply(value)
            elif kind == "fatal":
                log(value)
                code = 1
                break
            elif kind == "stop":
                log("stopping every worker")
                break
            self.restart_exited()
        self.stopping = True
        self.stop(list(self.workers.values()))
        if self.watch is not None and self.watch.poll() is None:
            self.watch.terminate()
            try:
                self.watch.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watch.kill()
        return code


def signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def format_share(share):
    """The share as planner exec writes it: 1 for a whole GPU, else the
    fraction, and 0 for none."""
    if share == int(share):
        return str(int(share))
    return repr(float(share))


def main(argv):
    args = parse_args(argv)
    return Launcher(args).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
