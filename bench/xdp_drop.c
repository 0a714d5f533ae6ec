// The benchmark's sink: drops every frame at the driver, so what arrives
// costs next to nothing (bench/l4_veth.py attaches it to the generator's
// end of the link).
#include <linux/bpf.h>

__attribute__((section("xdp"), used)) int sink(struct xdp_md *ctx)
{
    (void)ctx;
    return XDP_DROP;
}

char _license[] __attribute__((section("license"), used)) = "GPL";
