#include "textflag.h"

// func rawClone(nr, a1, a2 uintptr, p *Program, entry uintptr) (r1, errno uintptr)
//
// clone (nr SYS_clone: a1 the flags, a2 the child's stack pointer) or
// clone3 (nr SYS_clone3: a1 the clone_args, a2 their size, the stack in
// them). The child starts on its own stack (CLONE_VM: the parent's goes
// on being used by the parent) and calls entry, childEntry's code, with
// p in AX (the register ABI): directly, not through the ABI0 wrapper
// the toolchain would make, which under -race enters the race
// detector's state, the launcher's. p and entry travel in R12 and R13,
// which the kernel gives the child as the parent had them; g (R14) is
// nil in the child: nothing it runs may use it.
TEXT ·rawClone(SB),NOSPLIT|NOFRAME,$0-56
	MOVQ	nr+0(FP), AX
	MOVQ	a1+8(FP), DI
	MOVQ	a2+16(FP), SI
	MOVQ	p+24(FP), R12
	MOVQ	entry+32(FP), R13
	XORQ	DX, DX
	XORQ	R10, R10
	XORQ	R8, R8
	SYSCALL
	CMPQ	AX, $0
	JEQ	child
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	MOVQ	$-1, r1+40(FP)
	NEGQ	AX
	MOVQ	AX, errno+48(FP)
	RET
ok:
	MOVQ	AX, r1+40(FP)
	MOVQ	$0, errno+48(FP)
	RET
child:
	SUBQ	$16, SP // the callee's spill space for its register argument
	MOVQ	R12, AX
	XORQ	R14, R14
	XORPS	X15, X15
	CALL	R13
exit:
	MOVQ	$125, DI
	MOVQ	$231, AX // exit_group: childEntry does not return
	SYSCALL
	JMP	exit
