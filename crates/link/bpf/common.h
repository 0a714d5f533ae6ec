// SPDX-License-Identifier: Apache-2.0
//
// What Gatehouse's XDP programs share: section attributes, the helpers they
// call, and the legacy map definition (the "maps" section, so that no BTF
// is needed to load them).

#ifndef GATEHOUSE_BPF_COMMON_H
#define GATEHOUSE_BPF_COMMON_H

#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))

static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;

struct bpf_map_def {
    unsigned int type;
    unsigned int key_size;
    unsigned int value_size;
    unsigned int max_entries;
    unsigned int map_flags;
};

// An IPv4 address as a 16-byte key, ::ffff:a.b.c.d (the maps key both
// families alike).
static __always_inline void mapped(__u8 *key, const __u8 *v4) {
    __builtin_memset(key, 0, 10);
    key[10] = 0xff;
    key[11] = 0xff;
    key[12] = v4[0];
    key[13] = v4[1];
    key[14] = v4[2];
    key[15] = v4[3];
}

#endif
