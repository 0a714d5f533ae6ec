// SPDX-License-Identifier: Apache-2.0
//
// WireGuard router mode's XDP programs, one per side. Each redirects the
// frames the router takes to the AF_XDP socket of the receiving queue;
// everything else goes on to the kernel (XDP_PASS), so the gateway itself
// stays reachable on both NICs and its own traffic is untouched.
//
//  - gatehouse_wg_lan: unicast IPv4/IPv6 packets whose destination is in
//    a peer's allowed IPs (ALLOWED, longest prefix) and is not one of the
//    host's own addresses (HOST);
//  - gatehouse_wg_wan: UDP datagrams to the tunnel's port (PORT) at one of
//    the host's addresses, whole. Every fragment goes to the kernel, the
//    first too (it carries the port, the later ones do not): the kernel
//    reassembles them and hands the datagram to the plane's UDP socket.
//    IPv6 fragments carry a fragment header, so are not UDP here.
//
// Built with `clang -O2 -target bpf` by build.rs and loaded by aya. Maps
// use the legacy "maps" section so that no BTF is needed.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>

#include "common.h"

// Queue index -> AF_XDP socket, per side.
struct bpf_map_def SEC("maps") LAN_XSKS = { BPF_MAP_TYPE_XSKMAP, 4, 4, 256, 0 };
struct bpf_map_def SEC("maps") WAN_XSKS = { BPF_MAP_TYPE_XSKMAP, 4, 4, 256, 0 };
// The peers' allowed IPs: prefix length (in the 128-bit space, IPv4 as
// ::ffff:a.b.c.d), address (16) -> 1.
struct bpf_map_def SEC("maps") ALLOWED = { BPF_MAP_TYPE_LPM_TRIE, 20, 1, 65536, BPF_F_NO_PREALLOC };
// The host's own addresses (16 bytes, IPv4 mapped) -> 1.
struct bpf_map_def SEC("maps") HOST = { BPF_MAP_TYPE_HASH, 16, 1, 1024, 0 };
// [0]: the tunnel's UDP port, in network order.
struct bpf_map_def SEC("maps") PORT = { BPF_MAP_TYPE_ARRAY, 4, 4, 1, 0 };

struct lpm_key {
    __u32 prefixlen;
    __u8 addr[16];
};

#define ETH_HLEN_ 14

// The destination address of an IPv4 or IPv6 frame, as a 16-byte key,
// and where its layer 4 starts; 0 if it is neither or cut short.
static __always_inline const __u8 *destination(const __u8 *data, const void *end, __u8 *dst, __u8 *proto, int *fragment) {
    if ((const void *)(data + ETH_HLEN_) > end)
        return 0;
    __u16 ethertype = (__u16)data[12] << 8 | data[13];
    const __u8 *l3 = data + ETH_HLEN_;
    if (ethertype == ETH_P_IP) {
        if ((const void *)(l3 + 20) > end)
            return 0;
        __u32 ihl = (l3[0] & 0x0f) * 4;
        if (ihl < 20)
            return 0;
        mapped(dst, l3 + 16);
        *proto = l3[9];
        // More fragments (0x20), or a fragment offset.
        *fragment = (l3[6] & 0x3f) != 0 || l3[7] != 0;
        return l3 + ihl;
    }
    if (ethertype == ETH_P_IPV6) {
        if ((const void *)(l3 + 40) > end)
            return 0;
        __builtin_memcpy(dst, l3 + 24, 16);
        *proto = l3[6];
        *fragment = 0;
        return l3 + 40;
    }
    return 0;
}

static __always_inline int multicast(const __u8 *dst) {
    // IPv4 (mapped) multicast and broadcast; IPv6 multicast.
    if (dst[10] == 0xff && dst[11] == 0xff && dst[0] == 0)
        return (dst[12] & 0xf0) == 0xe0 || (dst[12] == 0xff && dst[13] == 0xff && dst[14] == 0xff && dst[15] == 0xff);
    return dst[0] == 0xff;
}

SEC("xdp")
int gatehouse_wg_lan(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const void *end = (const void *)(long)ctx->data_end;
    __u8 dst[16];
    __u8 proto;
    int fragment;
    if (!destination(data, end, dst, &proto, &fragment))
        return XDP_PASS;
    // Frames for another host's MAC, broadcast and multicast are not routed.
    if (data[0] & 1)
        return XDP_PASS;
    if (multicast(dst) || bpf_map_lookup_elem(&HOST, dst))
        return XDP_PASS;
    struct lpm_key k;
    k.prefixlen = 128;
    __builtin_memcpy(k.addr, dst, 16);
    if (!bpf_map_lookup_elem(&ALLOWED, &k))
        return XDP_PASS;
    // Lower bits of the flags: the action when the queue has no socket.
    return bpf_redirect_map(&LAN_XSKS, ctx->rx_queue_index, XDP_PASS);
}

SEC("xdp")
int gatehouse_wg_wan(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const void *end = (const void *)(long)ctx->data_end;
    __u8 dst[16];
    __u8 proto;
    int fragment;
    const __u8 *l4 = destination(data, end, dst, &proto, &fragment);
    if (!l4 || proto != IPPROTO_UDP || fragment)
        return XDP_PASS;
    if ((const void *)(l4 + 8) > end)
        return XDP_PASS;
    __u32 zero = 0;
    __u32 *port = bpf_map_lookup_elem(&PORT, &zero);
    if (!port || *port != ((__u32)l4[2] | (__u32)l4[3] << 8))
        return XDP_PASS;
    if (!bpf_map_lookup_elem(&HOST, dst))
        return XDP_PASS;
    return bpf_redirect_map(&WAN_XSKS, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Apache-2.0";
