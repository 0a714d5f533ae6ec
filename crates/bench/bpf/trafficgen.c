// SPDX-License-Identifier: Apache-2.0
//
// The packet generator of `gatehouse bench l4-wire --via xdp`. The kernel
// runs it on frames of its own (BPF_PROG_TEST_RUN with live frames) and
// transmits what it returns XDP_TX for out of the chosen interface, as a
// NIC would hand frames over: no socket buffer is built for them, so what
// receives them pays what it would pay for a NIC's frames.
//
// Each frame gets the template's headers anew (recycled pages keep what a
// forwarder rewrote in them) and the source port of the next flow.

#include <linux/bpf.h>

#include "common.h"

#define HEADERS 54
// Ethernet and IPv4 without options: the source port, and TCP's checksum.
#define SPORT_AT 34
#define TCP_CSUM_AT 50

struct config {
    // The first HEADERS bytes of every frame (Ethernet, IPv4, and the UDP
    // or TCP header).
    __u8 headers[HEADERS];
    __u8 pad[2];
    // 1: TCP (its checksum adjusted for the port); 0: UDP without
    // checksum.
    __u32 tcp;
    // How many flows: source ports from the template's on.
    __u32 flows;
};

// 0 -> the config.
struct bpf_map_def SEC("maps") CONFIG = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct config), 1, 0 };
// 0 -> frames generated (the next flow).
struct bpf_map_def SEC("maps") COUNTER = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0 };

SEC("xdp")
int gatehouse_trafficgen(struct xdp_md *ctx)
{
    __u8 *data = (__u8 *)(long)ctx->data;
    __u8 *end = (__u8 *)(long)ctx->data_end;
    __u32 zero = 0;
    struct config *c = bpf_map_lookup_elem(&CONFIG, &zero);
    __u64 *n = bpf_map_lookup_elem(&COUNTER, &zero);
    if (!c || !n || data + HEADERS > end)
        return XDP_ABORTED;
    __builtin_memcpy(data, c->headers, HEADERS);
    __u32 flows = c->flows ? c->flows : 1;
    __u16 base = ((__u16)data[SPORT_AT] << 8) | data[SPORT_AT + 1];
    __u16 port = base + (__u16)(*n % flows);
    *n += 1;
    data[SPORT_AT] = port >> 8;
    data[SPORT_AT + 1] = port & 0xff;
    if (c->tcp) {
        // RFC 1624: HC' = ~(~HC + ~m + m').
        __u32 hc = ((__u32)data[TCP_CSUM_AT] << 8) | data[TCP_CSUM_AT + 1];
        __u32 sum = (~hc & 0xffff) + (~(__u32)base & 0xffff) + port;
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        __u16 out = ~sum & 0xffff;
        data[TCP_CSUM_AT] = out >> 8;
        data[TCP_CSUM_AT + 1] = out & 0xff;
    }
    return XDP_TX;
}

char _license[] SEC("license") = "GPL";
