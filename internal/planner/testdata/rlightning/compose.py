#!/usr/bin/env python3
"""Compose rlightning job configs from the example groups in upstream/,
as Hydra does for these files, without Hydra: see README.md.

    python3 compose.py        # rewrites cases/*/config.yaml

Needs PyYAML only. Interpolations (${...}) are left as they are, as
`python train.py ... --cfg job` prints them.
"""

import copy
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

# case: (example, primary config, overrides). An override is GROUP=OPTION
# (pick another file of a group), KEY.PATH=VALUE (set a value) or
# +KEY.PATH=VALUE (add a key), as on rlightning's command line.
CASES = {
    "openpi_4t4e_libero_x4": ("openpi_ppo", "train_ppo", ["cluster=4t4e", "env=libero_x4"]),
    "openpi_ddp_sharded_x2": ("openpi_ppo", "train_ppo_ddp", ["buffer=sharded_buffer", "+buffer.storage.num_shards=2"]),
    "openpi_1t1e_cuda_buffer": ("openpi_ppo", "train_ppo", ["buffer.storage.device=cuda"]),
    "openvla_colocate_ddp_x8": ("openvla_ppo", "train_ppo_colocate_ddp_x8", []),
    "openvla_2t2e_manual": ("openvla_ppo", "train_ppo", ["cluster=2t2e_manual"]),
}


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def merge(dst, src):
    """OmegaConf.merge: mappings merge key by key, anything else replaces."""
    if isinstance(dst, dict) and isinstance(src, dict):
        out = dict(dst)
        for k, v in src.items():
            out[k] = merge(dst[k], v) if k in dst else copy.deepcopy(v)
        return out
    return copy.deepcopy(src)


def compose_file(conf, group, option, picks):
    """One config file with its own defaults list resolved: each entry
    GROUP: OPTION loads GROUP/OPTION.yaml (under this file's group) at key
    GROUP, in list order, then the file's own keys (_self_, last when the
    list does not name it)."""
    path = os.path.join(conf, group, option + ".yaml") if group else os.path.join(conf, option + ".yaml")
    body = load(path)
    if not isinstance(body, dict) or "defaults" not in body:
        return body
    defaults = body.pop("defaults")
    if "_self_" not in defaults:
        defaults = defaults + ["_self_"]
    out = {}
    for entry in defaults:
        if entry == "_self_":
            out = merge(out, body)
            continue
        (sub, opt), = entry.items()
        full = f"{group}/{sub}" if group else sub
        opt = picks.get(full, opt)
        out = merge(out, {sub: compose_file(conf, full, opt, picks)})
    return out


def set_path(cfg, dotted, value, add):
    keys = dotted.split(".")
    node = cfg
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if not add and keys[-1] not in node:
        sys.exit(f"override {dotted}: no such key (use +{dotted} to add it)")
    node[keys[-1]] = value


def compose(example, primary, overrides):
    conf = os.path.join(HERE, "upstream", example, "conf")
    picks, sets = {}, []
    for o in overrides:
        key, value = o.split("=", 1)
        add = key.startswith("+")
        key = key.lstrip("+")
        if not add and "." not in key:
            picks[key] = value
        else:
            sets.append((key, yaml.safe_load(value), add))
    cfg = compose_file(conf, "", primary, picks)
    for key, value, add in sets:
        set_path(cfg, key, value, add)
    return cfg


def main():
    for name, (example, primary, overrides) in CASES.items():
        cfg = compose(example, primary, overrides)
        out = os.path.join(HERE, "cases", name, "config.yaml")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            cmd = " ".join([f"python examples/{example}/train_ppo.py --config-name {primary}"] + overrides)
            f.write(f"# Composed by compose.py from RLightning's examples/{example}/conf: {cmd} --cfg job\n")
            yaml.safe_dump(cfg, f, sort_keys=False)


if __name__ == "__main__":
    main()
