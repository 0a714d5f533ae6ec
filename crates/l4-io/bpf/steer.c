// SPDX-License-Identifier: Apache-2.0
//
// Gatehouse's XDP steering program. It decides, per frame, whether the L4
// plane wants it and, if so, redirects it to the AF_XDP socket of the
// receiving queue; everything else goes on to the kernel (XDP_PASS), so
// the host's own traffic (SSH, health checks, the admin API) is untouched.
//
// The plane wants:
//  - IPv4/IPv6 packets addressed to an address it owns (a VIP, an FNAT
//    local address), whatever they carry: malformed ones too, so that they
//    are counted where the rest of the plane's drops are;
//  - ARP requests and IPv6 neighbour solicitations for those addresses;
//  - NAT replies: TCP/UDP from a real server's (address, port) addressed to
//    someone other than this host;
//  - SNAT: TCP/UDP from a host of an SNAT rule's source networks to
//    someone other than this host.
//
// Built with `clang -O2 -target bpf` by build.rs and loaded by aya. Maps
// use the legacy "maps" section so that no BTF is needed.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>

#define IPPROTO_ICMPV6_ 58

#include "common.h"

// Queue index -> AF_XDP socket.
struct bpf_map_def SEC("maps") XSKS = { BPF_MAP_TYPE_XSKMAP, 4, 4, 256, 0 };
// Addresses the plane owns (16 bytes, IPv4 as ::ffff:a.b.c.d) -> 1.
struct bpf_map_def SEC("maps") OWNED = { BPF_MAP_TYPE_HASH, 16, 1, 4096, 0 };
// The host's own addresses -> 1.
struct bpf_map_def SEC("maps") HOST = { BPF_MAP_TYPE_HASH, 16, 1, 1024, 0 };
// Real servers of NAT services: address (16), port (network order, 2),
// protocol (1), zero (1) -> 1.
struct bpf_map_def SEC("maps") REALS = { BPF_MAP_TYPE_HASH, 20, 1, 65536, 0 };

// SNAT source networks: prefix length (in the 128-bit space, IPv4 as
// ::ffff:a.b.c.d), address (16) -> 1.
struct bpf_map_def SEC("maps") SNAT_SRC = { BPF_MAP_TYPE_LPM_TRIE, 20, 1, 1024, BPF_F_NO_PREALLOC };

struct lpm_key {
    __u32 prefixlen;
    __u8 addr[16];
};

struct real_key {
    __u8 addr[16];
    __u16 port;
    __u8 proto;
    __u8 zero;
};

#define ETH_HLEN_ 14
#define BE16(x) __builtin_bswap16(x)

static __always_inline int to_plane(struct xdp_md *ctx) {
    // Lower bits of the flags: the action when the queue has no socket.
    return bpf_redirect_map(&XSKS, ctx->rx_queue_index, XDP_PASS);
}

static __always_inline int is_nat_reply(const __u8 *src, const __u8 *dst, __u8 proto, const __u8 *l4, const void *end) {
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        return 0;
    if ((const void *)(l4 + 4) > end)
        return 0;
    struct real_key k;
    __builtin_memcpy(k.addr, src, 16);
    __builtin_memcpy(&k.port, l4, 2);
    k.proto = proto;
    k.zero = 0;
    if (!bpf_map_lookup_elem(&REALS, &k))
        return 0;
    return !bpf_map_lookup_elem(&HOST, dst);
}

static __always_inline int is_snat(const __u8 *src, const __u8 *dst, __u8 proto) {
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        return 0;
    struct lpm_key k;
    k.prefixlen = 128;
    __builtin_memcpy(k.addr, src, 16);
    if (!bpf_map_lookup_elem(&SNAT_SRC, &k))
        return 0;
    return !bpf_map_lookup_elem(&HOST, dst);
}

SEC("xdp")
int gatehouse_steer(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const void *end = (const void *)(long)ctx->data_end;
    if ((const void *)(data + ETH_HLEN_) > end)
        return XDP_PASS;
    __u16 ethertype = (__u16)data[12] << 8 | data[13];
    const __u8 *l3 = data + ETH_HLEN_;
    __u8 src[16], dst[16];

    if (ethertype == ETH_P_ARP) {
        // Request (op 1) for an owned target protocol address (offset 24).
        if ((const void *)(l3 + 28) > end || l3[6] != 0 || l3[7] != 1)
            return XDP_PASS;
        mapped(dst, l3 + 24);
        return bpf_map_lookup_elem(&OWNED, dst) ? to_plane(ctx) : XDP_PASS;
    }
    if (ethertype == ETH_P_IP) {
        if ((const void *)(l3 + 20) > end)
            return XDP_PASS;
        mapped(dst, l3 + 16);
        if (bpf_map_lookup_elem(&OWNED, dst))
            return to_plane(ctx);
        // Fragments other than the first carry no ports: the kernel's.
        if ((l3[6] & 0x1f) != 0 || l3[7] != 0)
            return XDP_PASS;
        mapped(src, l3 + 12);
        __u32 ihl = (l3[0] & 0x0f) * 4;
        if (ihl < 20 || ihl > 60)
            return XDP_PASS;
        if (is_nat_reply(src, dst, l3[9], l3 + ihl, end))
            return to_plane(ctx);
        return is_snat(src, dst, l3[9]) ? to_plane(ctx) : XDP_PASS;
    }
    if (ethertype == ETH_P_IPV6) {
        if ((const void *)(l3 + 40) > end)
            return XDP_PASS;
        __builtin_memcpy(dst, l3 + 24, 16);
        if (bpf_map_lookup_elem(&OWNED, dst))
            return to_plane(ctx);
        __u8 next = l3[6];
        const __u8 *l4 = l3 + 40;
        if (next == IPPROTO_ICMPV6_) {
            // Neighbour solicitation (135) for an owned target (offset 8).
            if ((const void *)(l4 + 24) > end || l4[0] != 135)
                return XDP_PASS;
            __builtin_memcpy(dst, l4 + 8, 16);
            return bpf_map_lookup_elem(&OWNED, dst) ? to_plane(ctx) : XDP_PASS;
        }
        __builtin_memcpy(src, l3 + 8, 16);
        if (is_nat_reply(src, dst, next, l4, end))
            return to_plane(ctx);
        return is_snat(src, dst, next) ? to_plane(ctx) : XDP_PASS;
    }
    return XDP_PASS;
}

char _license[] SEC("license") = "Apache-2.0";
