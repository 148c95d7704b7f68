// str's ELF entry on linux/amd64 (make build links with
// -ldflags=-E=main.fastEntry): the served `str run` fast path, run
// before Go's runtime starts (issue 19: the runtime's start was most of a
// served call's client time). It handles exactly one shape of command
// line and hands everything else to the runtime untouched.
//
// Accepted, and nothing else (each option at most once, in any order;
// a value "--opt V" or "--opt=V" as Go's flag package reads it):
//
//	str run [--serve S] [--profile P] [--timeout D] -- CMD [ARGS...]
//
// with a socket from --serve, else from $STR_SERVE_SOCKET (its first
// entry, as os.Getenv), a pathname of at most 107 bytes, and
// $STR_PROFILE_DIR empty or unset (with one, str run is never served);
// argv[0] must not contain "bwrap" (str invoked as bwrap reads
// bubblewrap's command line), and the request must fit the server's
// receive buffer.
//
// Steps (all raw syscalls, no stack but the kernel's, no allocation):
//
//  1. parse argv and environ as above; anything else: the Go path;
//  2. socket(AF_UNIX, SOCK_SEQPACKET) and connect: on failure the Go
//     path, which finds nothing listening either and runs one-shot; a
//     socket below fd 3 (stdin, stdout or stderr closed) is the Go
//     path's too (Go's runtime puts /dev/null there);
//  3. block SIGHUP, SIGINT and SIGTERM and open a signalfd for them
//     (before the request is sent, so no signal goes unanswered; no
//     handlers: nothing runs asynchronously);
//  4. send the compact request (launcher/residentproto.go) with fds 0, 1
//     and 2 as SCM_RIGHTS; on failure the Go path;
//  5. wait with poll on the socket and the signalfd: a signal sends the
//     JSON cancel once, as the Go client's context does;
//  6. the reply: a result is written (its stderr text to fd 2) and its
//     status is the exit status (the server applied Result.Outcome, as
//     the Go path does); not_poolable, refused, error or a reply this
//     stub cannot read (an older server's JSON) undo steps 2-3 (the
//     signal mask restored) and go to the Go path, which asks again and
//     answers as always; no reply at all (the server went away: the
//     command may have run, so it is not run again) is exit 123
//     (launcher.ExitResidentLost) with the Go path's message ("... died
//     during the call; the command may have run (no reply: EOF)"; a
//     failed read or poll says "connection closed" where Go names the
//     errno); a reply this stub cannot decode is exit 125. A cancelling signal
//     that came before a not_poolable, refused or error answer stays
//     pending: restoring the mask ends str by its default action before
//     the Go path starts (the Go path would run one-shot with its
//     context already cancelled).
//
// The Go path is _rt0_amd64_linux with the stack exactly as the kernel
// left it (SP is never moved; the stub's state lives in its own BSS).

#include "textflag.h"

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_poll 7
#define SYS_rt_sigprocmask 14
#define SYS_socket 41
#define SYS_connect 42
#define SYS_sendto 44
#define SYS_sendmsg 46
#define SYS_getsockopt 55
#define SYS_geteuid 107
#define SYS_exit_group 231
#define SYS_signalfd4 289

#define AF_UNIX 1
#define SOL_SOCKET 1
#define SO_PEERCRED 17
#define SOCK_SEQPACKET_CLOEXEC 0x80005
#define SFD_CLOEXEC 0x80000
#define MSG_NOSIGNAL 0x4000
#define SIG_BLOCK 0
#define SIG_SETMASK 2
#define EINTR 4
// SIGHUP (1), SIGINT (2), SIGTERM (15): bits signo-1.
#define CANCEL_SIGNALS 0x4003

// The compact request's size bound: the server's receive buffer
// (launcher: 4 x nsinit.MaxCallBytes); a larger one takes the Go path.
#define REQ_MAX 524288
// launcher.CompactReplyMax, and one byte more to see a longer reply.
#define REPLY_MAX 65536
#define COMPACT_MAGIC 0x01525453
#define COMPACT_RESULT 1
#define COMPACT_NOT_POOLABLE 2
#define COMPACT_ERROR 4
#define EXIT_LAUNCHER 125
#define EXIT_RESIDENT_LOST 123

DATA	optnames<>+0(SB)/8, $"serve\x00pr"
DATA	optnames<>+8(SB)/8, $"ofile\x00ti"
DATA	optnames<>+16(SB)/4, $"meou"
DATA	optnames<>+20(SB)/2, $"t\x00"
DATA	optnames<>+22(SB)/1, $"\x00"
GLOBL	optnames<>(SB), RODATA|NOPTR, $23

DATA	envnames<>+0(SB)/8, $"STR_SERV"
DATA	envnames<>+8(SB)/8, $"E_SOCKET"
DATA	envnames<>+16(SB)/8, $"=\x00STR_PR"
DATA	envnames<>+24(SB)/8, $"OFILE_DI"
DATA	envnames<>+32(SB)/8, $"R=\x00STR_S"
DATA	envnames<>+40(SB)/8, $"TATE_DIR"
DATA	envnames<>+48(SB)/2, $"=\x00"
DATA	envnames<>+50(SB)/1, $"\x00"
GLOBL	envnames<>(SB), RODATA|NOPTR, $51

// The default socket (launcher.DefaultResidentSocket): root's, and the
// name under $STR_STATE_DIR.
DATA	rootsock<>+0(SB)/8, $"/run/str"
DATA	rootsock<>+8(SB)/8, $"/serve.s"
DATA	rootsock<>+16(SB)/4, $"ock\x00"
GLOBL	rootsock<>(SB), RODATA|NOPTR, $20
DATA	sockname<>+0(SB)/8, $"/serve.s"
DATA	sockname<>+8(SB)/4, $"ock\x00"
GLOBL	sockname<>(SB), RODATA|NOPTR, $12

DATA	empty<>+0(SB)/1, $"\x00"
GLOBL	empty<>(SB), RODATA|NOPTR, $1

DATA	cancelmsg<>+0(SB)/8, $"{\x22type\x22:"
DATA	cancelmsg<>+8(SB)/8, $"\x22cancel\x22"
DATA	cancelmsg<>+16(SB)/1, $"}"
GLOBL	cancelmsg<>(SB), RODATA|NOPTR, $17

DATA	noreply1<>+0(SB)/8, $"str run:"
DATA	noreply1<>+8(SB)/8, $" residen"
DATA	noreply1<>+16(SB)/8, $"t launch"
DATA	noreply1<>+24(SB)/4, $"er \x00"
GLOBL	noreply1<>(SB), RODATA|NOPTR, $28

DATA	noreply2<>+0(SB)/8, $" died du"
DATA	noreply2<>+8(SB)/8, $"ring the"
DATA	noreply2<>+16(SB)/8, $" call; t"
DATA	noreply2<>+24(SB)/8, $"he comma"
DATA	noreply2<>+32(SB)/8, $"nd may h"
DATA	noreply2<>+40(SB)/8, $"ave run "
DATA	noreply2<>+48(SB)/8, $"(no repl"
DATA	noreply2<>+56(SB)/8, $"y: conne"
DATA	noreply2<>+64(SB)/8, $"ction cl"
DATA	noreply2<>+72(SB)/4, $"osed"
DATA	noreply2<>+76(SB)/2, $")\x0a"
DATA	noreply2<>+78(SB)/1, $"\x00"
GLOBL	noreply2<>(SB), RODATA|NOPTR, $79

DATA	noreplyeof<>+0(SB)/8, $" died du"
DATA	noreplyeof<>+8(SB)/8, $"ring the"
DATA	noreplyeof<>+16(SB)/8, $" call; t"
DATA	noreplyeof<>+24(SB)/8, $"he comma"
DATA	noreplyeof<>+32(SB)/8, $"nd may h"
DATA	noreplyeof<>+40(SB)/8, $"ave run "
DATA	noreplyeof<>+48(SB)/8, $"(no repl"
DATA	noreplyeof<>+56(SB)/8, $"y: EOF)\x0a"
DATA	noreplyeof<>+64(SB)/1, $"\x00"
GLOBL	noreplyeof<>(SB), RODATA|NOPTR, $65

DATA	badreply2<>+0(SB)/8, $": bad re"
DATA	badreply2<>+8(SB)/4, $"ply\x0a"
DATA	badreply2<>+12(SB)/1, $"\x00"
GLOBL	badreply2<>(SB), RODATA|NOPTR, $13

// The stub's state.
GLOBL	opts<>(SB), NOPTR, $24      // --serve, --profile, --timeout values (0: not given)
GLOBL	envvals<>(SB), NOPTR, $24   // $STR_SERVE_SOCKET, $STR_PROFILE_DIR, $STR_STATE_DIR (0: unset)
GLOBL	defsock<>(SB), NOPTR, $112  // $STR_STATE_DIR/serve.sock
GLOBL	cred<>(SB), NOPTR, $16      // struct ucred (pid, uid, gid), then its length
GLOBL	head<>(SB), NOPTR, $32      // the request's first strings, 0-terminated list
GLOBL	st<>(SB), NOPTR, $64        // 0 socket fd, 8 signalfd, 16 cancelled, 24 socket path, 32 old signal mask, 40 signal set, 56 address length
GLOBL	addr<>(SB), NOPTR, $112     // sockaddr_un
GLOBL	msg<>(SB), NOPTR, $112      // msghdr (56), iovec (16), cmsg with three fds (32)
GLOBL	pfd<>(SB), NOPTR, $16       // two pollfds
GLOBL	req<>(SB), NOPTR, $REQ_MAX
GLOBL	reply<>(SB), NOPTR, $(REPLY_MAX+8)

TEXT ·fastEntry(SB), NOSPLIT|NOFRAME, $0
	// 1. The command line. R12 argc, R13 argv, R14 envp.
	MOVQ	0(SP), R12
	LEAQ	8(SP), R13
	LEAQ	8(R13)(R12*8), R14
	CMPQ	R12, $4 // str run -- CMD at least
	JLT	gopath
	// str invoked as bwrap takes bubblewrap's command line: any argv[0]
	// with "bwrap" in it is the Go path's (stricter than its basename).
	MOVQ	0(R13), SI
	TESTQ	SI, SI
	JEQ	gopath

argv0:
	MOVBLZX	0(SI), AX
	TESTB	AL, AL
	JEQ	argv0done
	INCQ	SI
	CMPB	AL, $'b'
	JNE	argv0
	CMPB	0(SI), $'w'
	JNE	argv0
	CMPB	1(SI), $'r'
	JNE	argv0
	CMPB	2(SI), $'a'
	JNE	argv0
	CMPB	3(SI), $'p'
	JEQ	gopath
	JMP	argv0

argv0done:
	MOVQ	8(R13), SI
	CMPB	0(SI), $'r'
	JNE	gopath
	CMPB	1(SI), $'u'
	JNE	gopath
	CMPB	2(SI), $'n'
	JNE	gopath
	CMPB	3(SI), $0
	JNE	gopath
	MOVQ	$2, R9 // the next argument

opt:
	CMPQ	R9, R12
	JGE	gopath // options and no "--"
	MOVQ	(R13)(R9*8), SI
	CMPB	0(SI), $'-'
	JNE	gopath
	CMPB	1(SI), $'-'
	JNE	gopath
	CMPB	2(SI), $0
	JEQ	dashdash
	ADDQ	$2, SI
	LEAQ	optnames<>(SB), DI
	XORQ	R10, R10 // the option's index

optname:
	CMPB	0(DI), $0
	JEQ	gopath // no such option here: the Go path reads it
	MOVQ	SI, DX

optcmp:
	MOVBLZX	0(DI), AX
	TESTB	AL, AL
	JEQ	optend
	CMPB	0(DX), AL
	JNE	optskip
	INCQ	DX
	INCQ	DI
	JMP	optcmp

optskip:
	CMPB	0(DI), $0
	JEQ	optnext
	INCQ	DI
	JMP	optskip

optnext:
	INCQ	DI // past the name's NUL
	INCQ	R10
	JMP	optname

optend:
	// The name matched up to DX: the argument ends there, or "=VALUE".
	MOVBLZX	0(DX), AX
	TESTB	AL, AL
	JEQ	optsep
	CMPB	AL, $'='
	JNE	optnext
	LEAQ	1(DX), SI
	JMP	optval

optsep:
	INCQ	R9
	CMPQ	R9, R12
	JGE	gopath // a flag without its value
	MOVQ	(R13)(R9*8), SI

optval:
	INCQ	R9
	LEAQ	opts<>(SB), DI
	CMPQ	(DI)(R10*8), $0
	JNE	gopath // given twice
	MOVQ	SI, (DI)(R10*8)
	JMP	opt

dashdash:
	INCQ	R9
	CMPQ	R9, R12
	JGE	gopath // no command
	MOVQ	R9, R15 // CMD's index

	// The environment: its size, and the first entry of each name.
	MOVQ	R14, BX
	XORQ	R8, R8 // envc

env:
	MOVQ	0(BX), SI
	TESTQ	SI, SI
	JEQ	envdone
	INCQ	R8
	LEAQ	envnames<>(SB), DI
	XORQ	R10, R10

envname:
	CMPB	0(DI), $0
	JEQ	envnext
	MOVQ	SI, DX

envcmp:
	MOVBLZX	0(DI), AX
	TESTB	AL, AL
	JEQ	envmatch
	CMPB	0(DX), AL
	JNE	envskip
	INCQ	DX
	INCQ	DI
	JMP	envcmp

envskip:
	CMPB	0(DI), $0
	JEQ	envnn
	INCQ	DI
	JMP	envskip

envnn:
	INCQ	DI
	INCQ	R10
	JMP	envname

envmatch:
	// The name (with its '=') matched: DX is the value.
	LEAQ	envvals<>(SB), DI
	CMPQ	(DI)(R10*8), $0
	JNE	envnext // a later entry of the same name: the first counts
	MOVQ	DX, (DI)(R10*8)

envnext:
	ADDQ	$8, BX
	JMP	env

envdone:
	// $STR_PROFILE_DIR set: never served.
	MOVQ	envvals<>+8(SB), SI
	TESTQ	SI, SI
	JEQ	socketname
	CMPB	0(SI), $0
	JNE	gopath

socketname:
	// The socket: --serve, else $STR_SERVE_SOCKET ("" is none for both),
	// else the default.
	MOVQ	opts<>+0(SB), SI
	TESTQ	SI, SI
	JNE	sockpath
	MOVQ	envvals<>+0(SB), SI
	TESTQ	SI, SI
	JNE	sockpath
	// The default, as launcher.DefaultResidentSocket: serve.sock in the
	// state directory, which is $STR_STATE_DIR when set and not empty
	// (filepath.Clean of it: a value Clean would change is the Go
	// path's), else root's /run/str, else (not root) the Go path's.
	MOVQ	envvals<>+16(SB), SI
	TESTQ	SI, SI
	JEQ	rootdefault
	CMPB	0(SI), $0
	JEQ	rootdefault
	CMPB	0(SI), $'/'
	JNE	gopath // relative: str refuses it (statedir.Check)
	LEAQ	defsock<>(SB), DI
	XORQ	CX, CX

statecopy:
	MOVBLZX	(SI)(CX*1), AX
	TESTB	AL, AL
	JEQ	statedone
	CMPB	AL, $'/'
	JNE	statestore
	// "//", "/." ("/./", "/../", or a dot name: taken as Clean might
	// change it) and a trailing '/' are the Go path's.
	MOVBLZX	1(SI)(CX*1), DX
	CMPB	DL, $'/'
	JEQ	gopath
	CMPB	DL, $'.'
	JEQ	gopath
	TESTB	DL, DL
	JEQ	gopath

statestore:
	MOVB	AL, (DI)(CX*1)
	INCQ	CX
	CMPQ	CX, $96
	JGT	gopath // with "/serve.sock", longer than sun_path holds
	JMP	statecopy

statedone:
	MOVQ	sockname<>+0(SB), AX
	MOVQ	AX, (DI)(CX*1)
	MOVL	sockname<>+8(SB), AX
	MOVL	AX, 8(DI)(CX*1)
	MOVQ	DI, SI
	JMP	sockpath

rootdefault:
	MOVQ	$SYS_geteuid, AX
	SYSCALL
	TESTQ	AX, AX
	JNE	gopath
	LEAQ	rootsock<>(SB), SI

sockpath:
	CMPB	0(SI), $0
	JEQ	gopath
	CMPB	0(SI), $'@' // Go's abstract-socket spelling: the Go path
	JEQ	gopath
	MOVQ	SI, st<>+24(SB)
	LEAQ	addr<>(SB), DI
	MOVW	$AF_UNIX, 0(DI)
	ADDQ	$2, DI
	XORQ	CX, CX

sockcopy:
	MOVBLZX	(SI)(CX*1), AX
	MOVB	AL, (DI)(CX*1)
	TESTB	AL, AL
	JEQ	sockdone
	INCQ	CX
	CMPQ	CX, $108
	JGE	gopath // longer than sun_path holds
	JMP	sockcopy

sockdone:
	LEAQ	3(CX), AX
	MOVQ	AX, st<>+56(SB) // the address's length: family, path, NUL

	// The request: header, profile, timeout, argv from CMD, environ.
	LEAQ	req<>(SB), DI
	LEAQ	req<>+REQ_MAX(SB), R11
	MOVL	$COMPACT_MAGIC, 0(DI)
	MOVQ	R12, AX
	SUBQ	R15, AX
	MOVL	AX, 4(DI)
	MOVL	R8, 8(DI)
	ADDQ	$12, DI
	LEAQ	empty<>(SB), AX
	MOVQ	opts<>+8(SB), SI
	TESTQ	SI, SI
	CMOVQEQ	AX, SI
	MOVQ	SI, head<>+0(SB)
	MOVQ	opts<>+16(SB), SI
	TESTQ	SI, SI
	CMOVQEQ	AX, SI
	MOVQ	SI, head<>+8(SB)
	MOVQ	$0, head<>+16(SB)
	LEAQ	head<>(SB), BX
	XORQ	R10, R10 // which list: head, argv, environ

copylist:
	MOVQ	0(BX), SI
	TESTQ	SI, SI
	JEQ	copylistend
	ADDQ	$8, BX

copystr:
	CMPQ	DI, R11
	JGE	gopath // larger than the server takes: the Go path
	MOVBLZX	0(SI), AX
	MOVB	AL, 0(DI)
	INCQ	SI
	INCQ	DI
	TESTB	AL, AL
	JNE	copystr
	JMP	copylist

copylistend:
	INCQ	R10
	CMPQ	R10, $1
	JNE	copyenv
	LEAQ	(R13)(R15*8), BX
	JMP	copylist

copyenv:
	CMPQ	R10, $2
	JNE	copied
	MOVQ	R14, BX
	JMP	copylist

copied:
	LEAQ	req<>(SB), AX
	SUBQ	AX, DI
	MOVQ	DI, R8 // the request's length

	// 2. Connect.
	MOVQ	$SYS_socket, AX
	MOVQ	$AF_UNIX, DI
	MOVQ	$SOCK_SEQPACKET_CLOEXEC, SI
	XORQ	DX, DX
	SYSCALL
	CMPQ	AX, $0
	JLT	gopath
	MOVQ	AX, st<>+0(SB)
	// The lowest free descriptor: below 3, one of stdin, stdout and
	// stderr is closed, and the socket took its place (it would be sent
	// as the tool's stdio). The Go path: Go's runtime opens /dev/null
	// there first, as it always has.
	CMPQ	AX, $3
	JLT	undosocket
	MOVQ	AX, DI
	MOVQ	$SYS_connect, AX
	LEAQ	addr<>(SB), SI
	MOVQ	st<>+56(SB), DX
	SYSCALL
	CMPQ	AX, $0
	JLT	undosocket
	// The listener must be root (launcher.CallResident's check: str
	// serve runs only as root, and nothing else is sent the request or
	// the caller's stdio): SO_PEERCRED, the listener's credentials as of
	// its listen(). Anything else, or no answer, is the Go path's, which
	// asks again and says why it runs one-shot.
	MOVL	$12, cred<>+12(SB)
	MOVQ	R8, R9 // the request's length, kept across the call
	MOVQ	$SYS_getsockopt, AX
	MOVQ	st<>+0(SB), DI
	MOVQ	$SOL_SOCKET, SI
	MOVQ	$SO_PEERCRED, DX
	LEAQ	cred<>(SB), R10
	LEAQ	cred<>+12(SB), R8
	SYSCALL
	MOVQ	R9, R8
	CMPQ	AX, $0
	JNE	undosocket
	CMPL	cred<>+4(SB), $0
	JNE	undosocket

	// 3. The cancelling signals: blocked, read from a signalfd.
	MOVQ	$CANCEL_SIGNALS, st<>+40(SB)
	MOVQ	$SYS_rt_sigprocmask, AX
	MOVQ	$SIG_BLOCK, DI
	LEAQ	st<>+40(SB), SI
	LEAQ	st<>+32(SB), DX
	MOVQ	$8, R10
	SYSCALL
	CMPQ	AX, $0
	JLT	undosocket
	MOVQ	$SYS_signalfd4, AX
	MOVQ	$-1, DI
	LEAQ	st<>+40(SB), SI
	MOVQ	$8, DX
	MOVQ	$SFD_CLOEXEC, R10
	SYSCALL
	CMPQ	AX, $0
	JLT	undomask
	MOVQ	AX, st<>+8(SB)

	// 4. The request, with fds 0, 1, 2.
	LEAQ	msg<>(SB), DI
	MOVQ	$0, 0(DI)     // msg_name
	MOVQ	$0, 8(DI)     // msg_namelen
	LEAQ	56(DI), AX
	MOVQ	AX, 16(DI)     // msg_iov
	MOVQ	$1, 24(DI)    // msg_iovlen
	LEAQ	72(DI), AX
	MOVQ	AX, 32(DI)     // msg_control
	MOVQ	$32, 40(DI)   // msg_controllen: CMSG_SPACE(12)
	MOVQ	$0, 48(DI)    // msg_flags
	LEAQ	req<>(SB), AX
	MOVQ	AX, 56(DI)     // iov_base
	MOVQ	R8, 64(DI)     // iov_len
	MOVQ	$28, 72(DI)   // cmsg_len: CMSG_LEN(12)
	MOVL	$1, 80(DI)    // SOL_SOCKET
	MOVL	$1, 84(DI)    // SCM_RIGHTS
	MOVL	$0, 88(DI)    // stdin
	MOVL	$1, 92(DI)    // stdout
	MOVL	$2, 96(DI)    // stderr
	MOVL	$0, 100(DI)
	MOVQ	DI, SI
	MOVQ	st<>+0(SB), DI
	MOVQ	$MSG_NOSIGNAL, DX
	MOVQ	$SYS_sendmsg, AX
	SYSCALL
	CMPQ	AX, R8
	JNE	undoall

	// 5. Wait for the reply; a signal sends the cancel once.
wait:
	LEAQ	pfd<>(SB), DI
	MOVQ	st<>+0(SB), AX
	MOVL	AX, 0(DI)
	MOVL	$1, 4(DI) // POLLIN, revents 0
	MOVQ	st<>+8(SB), AX
	MOVL	AX, 8(DI)
	MOVL	$1, 12(DI)
	MOVQ	$2, SI
	CMPQ	st<>+16(SB), $0
	JEQ	dopoll
	MOVQ	$1, SI // cancelled: the signalfd no longer watched

dopoll:
	MOVQ	$-1, DX
	MOVQ	$SYS_poll, AX
	SYSCALL
	CMPQ	AX, $-EINTR
	JEQ	wait
	CMPQ	AX, $0
	JLT	noreply
	CMPW	pfd<>+6(SB), $0
	JNE	readreply
	CMPW	pfd<>+14(SB), $0
	JEQ	wait
	// A cancelling signal (left pending: it is read by no one).
	MOVQ	$1, st<>+16(SB)
	MOVQ	$SYS_sendto, AX
	MOVQ	st<>+0(SB), DI
	LEAQ	cancelmsg<>(SB), SI
	MOVQ	$17, DX
	MOVQ	$MSG_NOSIGNAL, R10
	XORQ	R8, R8
	XORQ	R9, R9
	SYSCALL
	JMP	wait

readreply:
	// 6. The reply.
	MOVQ	$SYS_read, AX
	MOVQ	st<>+0(SB), DI
	LEAQ	reply<>(SB), SI
	MOVQ	$(REPLY_MAX+1), DX
	SYSCALL
	CMPQ	AX, $-EINTR
	JEQ	readreply
	CMPQ	AX, $0
	JEQ	noreplyeof
	JLT	noreply
	CMPQ	AX, $12
	JLT	undoall // not a compact reply (an older server's JSON): the Go path
	CMPL	reply<>+0(SB), $COMPACT_MAGIC
	JNE	undoall
	CMPQ	AX, $REPLY_MAX
	JGT	badreply
	MOVBLZX	reply<>+4(SB), CX
	CMPQ	CX, $COMPACT_RESULT
	JEQ	result
	CMPQ	CX, $COMPACT_NOT_POOLABLE
	JLT	badreply
	CMPQ	CX, $COMPACT_ERROR
	JLE	undoall // not_poolable, refused, error: nothing ran; the Go path asks again
	JMP	badreply

result:
	// The text str run writes to stderr, then its status.
	LEAQ	reply<>+12(SB), SI
	LEAQ	-12(AX), DX

writetext:
	TESTQ	DX, DX
	JEQ	exit
	MOVQ	$SYS_write, AX
	MOVQ	$2, DI
	SYSCALL
	CMPQ	AX, $-EINTR
	JEQ	writetext
	CMPQ	AX, $0
	JLE	exit
	ADDQ	AX, SI
	SUBQ	AX, DX
	JMP	writetext

exit:
	MOVLQSX	reply<>+8(SB), DI
	MOVQ	$SYS_exit_group, AX
	SYSCALL

noreplyeof:
	// The server closed the connection (as Go's read reports it) after
	// it was sent the call: the command may have run (exit 123,
	// launcher.ExitResidentLost, as launcher.ResidentLostError).
	LEAQ	noreplyeof<>(SB), BX
	MOVQ	$EXIT_RESIDENT_LOST, R15
	JMP	failmsg

noreply:
	LEAQ	noreply2<>(SB), BX
	MOVQ	$EXIT_RESIDENT_LOST, R15
	JMP	failmsg

badreply:
	LEAQ	badreply2<>(SB), BX
	MOVQ	$EXIT_LAUNCHER, R15

failmsg:
	// "str run: resident launcher S" and BX's text, then exit R15.
	LEAQ	noreply1<>(SB), AX
	MOVQ	AX, head<>+0(SB)
	MOVQ	st<>+24(SB), AX
	MOVQ	AX, head<>+8(SB)
	MOVQ	BX, head<>+16(SB)
	MOVQ	$0, head<>+24(SB)
	LEAQ	head<>(SB), BX
	LEAQ	reply<>(SB), DI

msgpart:
	MOVQ	0(BX), SI
	TESTQ	SI, SI
	JEQ	msgwrite
	ADDQ	$8, BX

msgcopy:
	MOVBLZX	0(SI), AX
	TESTB	AL, AL
	JEQ	msgpart
	MOVB	AL, 0(DI)
	INCQ	SI
	INCQ	DI
	JMP	msgcopy

msgwrite:
	LEAQ	reply<>(SB), SI
	MOVQ	DI, DX
	SUBQ	SI, DX
	MOVQ	$SYS_write, AX
	MOVQ	$2, DI
	SYSCALL
	MOVQ	R15, DI
	MOVQ	$SYS_exit_group, AX
	SYSCALL

undoall:
	MOVQ	$SYS_close, AX
	MOVQ	st<>+8(SB), DI
	SYSCALL

undomask:
	MOVQ	$SYS_rt_sigprocmask, AX
	MOVQ	$SIG_SETMASK, DI
	LEAQ	st<>+32(SB), SI
	XORQ	DX, DX
	MOVQ	$8, R10
	SYSCALL

undosocket:
	MOVQ	$SYS_close, AX
	MOVQ	st<>+0(SB), DI
	SYSCALL

gopath:
	// Go's own entry, the stack as the kernel made it.
	JMP	_rt0_amd64_linux(SB)
