// LD_PRELOAD library for tools/as_avx2.sh: every CPUID the process runs answers as AMD
// EPYC-Rome cores would (AVX2; no AVX-512, no bf16 or AMX instructions), while the
// process runs natively. It turns on Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID),
// so each CPUID instruction raises SIGSEGV; the handler runs the real CPUID, clears the
// feature bits Rome lacks and steps over the instruction. The setting survives fork and
// clone and is reset by execve, which loads this library again from LD_PRELOAD.
//
// The program's own SIGSEGV handlers (Python's faulthandler, pytest's) are kept aside by
// wrapping sigaction() and signal(), and are called for every other SIGSEGV.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_SET_CPUID 0x1012

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction app_handler;  // what the program asked for; SIG_DFL at first

static void real_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
}

#define BIT(n) (1u << (n))

// Clears what Zen 2 (EPYC-Rome) does not have but newer AMD and Intel cores do.
static void as_rome(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 7 && sub == 0) {
    r[0] = 0;  // no subleaf 1 (where AVX512-BF16 and AVX-VNNI are announced)
    // AVX512F, DQ, IFMA, PF, ER, CD, BW, VL
    r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
    // AVX512_VBMI, VBMI2, GFNI, VAES, VPCLMULQDQ, AVX512_VNNI, BITALG, VPOPCNTDQ
    r[2] &= ~(BIT(1) | BIT(6) | BIT(8) | BIT(9) | BIT(10) | BIT(11) | BIT(12) | BIT(14));
    // AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8
    r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
  } else if (leaf == 7) {
    r[0] = r[1] = r[2] = r[3] = 0;
  } else if (leaf == 0xd && sub == 0) {
    // XSAVE components: opmask, ZMM_Hi256, Hi16_ZMM, AMX tile config and data
    r[0] &= ~(BIT(5) | BIT(6) | BIT(7) | BIT(17) | BIT(18));
  } else if (leaf == 0xd && (sub == 5 || sub == 6 || sub == 7 || sub == 17 || sub == 18)) {
    r[0] = r[1] = r[2] = r[3] = 0;
  } else if (leaf == 0x1d || leaf == 0x1e) {  // AMX tile information
    r[0] = r[1] = r[2] = r[3] = 0;
  }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
  ucontext_t *uc = context;
  greg_t *g = uc->uc_mcontext.gregs;
  const unsigned char *ip = (const unsigned char *)g[REG_RIP];
  // A CPUID fault is a general-protection fault (SI_KERNEL) at an instruction that was
  // just fetched, so reading it is safe.
  if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
    uint32_t r[4];
    uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
    real_cpuid(leaf, sub, r);
    as_rome(leaf, sub, r);
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    return;
  }
  if (app_handler.sa_flags & SA_SIGINFO) {
    app_handler.sa_sigaction(sig, info, context);
  } else if (app_handler.sa_handler != SIG_DFL && app_handler.sa_handler != SIG_IGN) {
    app_handler.sa_handler(sig);
  } else {
    // Default action: give the signal back to the kernel; the fault repeats and kills.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &dfl, NULL);
  }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (sig != SIGSEGV) return real_sigaction(sig, act, old);
  if (old) *old = app_handler;
  if (act) app_handler = *act;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  if (sig != SIGSEGV) {
    static sighandler_t (*real_signal)(int, sighandler_t);
    if (!real_signal) real_signal = (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
    return real_signal(sig, handler);
  }
  sighandler_t old = (app_handler.sa_flags & SA_SIGINFO) ? SIG_DFL : app_handler.sa_handler;
  memset(&app_handler, 0, sizeof app_handler);
  app_handler.sa_handler = handler;
  return old;
}

__attribute__((constructor)) static void start(void) {
  real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  app_handler.sa_handler = SIG_DFL;
  struct sigaction act;
  memset(&act, 0, sizeof act);
  act.sa_sigaction = on_segv;
  act.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  real_sigaction(SIGSEGV, &act, NULL);
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    perror("avx2_cpuid: arch_prctl(ARCH_SET_CPUID) (these cores have no CPUID faulting)");
    exit(2);
  }
}
