/* BTF raw tracepoints (tp_btf): ctx[i] is the i-th argument of the tracepoint's TP_PROTO, as the kernel passes
 * it (no record is copied), and its pointers are typed by the kernel's BTF, so CK_MEMBER reads a member with a
 * plain load that the verifier checks against that type. The offsets are -D macros that chaoskit takes from
 * /sys/kernel/btf/vmlinux; chaoskit/probes/btf_programs.py loads these functions (bcc's loader cannot).
 * CK_READ is for a member the BTF type does not cover (inet_sock's, through a struct sock pointer). */
#define TP_BTF(event) int tp_btf__##event(u64 *ctx)
#define CK_MEMBER(type, base, offset) (*(type *)((base) + (offset)))
#define CK_READ(dst, base, offset) bpf_probe_read_kernel(&(dst), sizeof(dst), (void *)((base) + (offset)))
