/*
 * gpuhpc command-server client (see gpuhpc/cmdserver/__init__.py and docs/cmdserver.md).
 *
 * A small C front-end for the gpuhpc CLI, in the manner of Mercurial's chg: it hands its
 * argv, environment, cwd, umask, ids, groups, resource limits and its stdin/stdout/stderr
 * descriptors to a warm Python server over a Unix socket, forwards signals to the worker that
 * runs the command, and exits with that command's exit code. Whenever the server cannot be
 * used it execs the plain Python CLI (GPUHPC_PYTHON -P -m gpuhpc ...), so behaviour never
 * depends on the server. A worker serves a command only if the caller's uid, gid, groups and
 * resource limits equal its own (a job inherits them from the process that runs sbatch).
 *
 * Built by `gpuhpc cmdserver install-client`, which bakes in:
 *   GPUHPC_PYTHON     the interpreter of the gpuhpc install (sys.executable)
 *   GPUHPC_SERVER_ID  12 hex digits naming this install's server socket
 *
 * Protocol: gpuhpc/cmdserver/protocol.py (all integers big-endian):
 *   client -> server  "GPH2" u32 LEN, with SCM_RIGHTS fds 0,1,2; then LEN bytes of
 *                     NUL-terminated fields: cwd, umask (octal), "RUID EUID RGID EGID",
 *                     groups (ascending, space-separated), "N SOFT0 HARD0 ..." (getrlimit
 *                     0..N-1, -1 = unlimited), argc, argv[0..argc), env...
 *   server -> client  5-byte messages: 'P' i32 pid (command started; pid leads its process
 *                     group), 'X' i32 exit code (done), 'F' i32 reason (declined: run it yourself)
 *
 * The client never decides whether a server may run: when it finds none it runs the command
 * with `GPUHPC_PYTHON -P -m gpuhpc.cmdserver autostart SOCKET ARGS...`, which starts one only
 * if the config enables it (gpuhpc/config.py) and then runs the command in that process.
 * `gpuhpc cmdserver ...` always runs the Python CLI. Environment: GPUHPC_CMDSERVER=off runs the
 * Python CLI directly; =noautostart uses a running server but never starts one.
 * GPUHPC_RUNTIME_DIR overrides where the socket lives (default $XDG_RUNTIME_DIR/gpuhpc, else
 * /tmp/gpuhpc-UID).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef GPUHPC_PYTHON
#error "build with -DGPUHPC_PYTHON=\"/path/to/python\" (gpuhpc cmdserver install-client)"
#endif
#ifndef GPUHPC_SERVER_ID
#error "build with -DGPUHPC_SERVER_ID=\"<hex>\" (gpuhpc cmdserver install-client)"
#endif

extern char **environ;

static volatile pid_t worker_pid = 0;
/* The signals forwarded to the worker. They are blocked from the moment the request (with our
 * stdin) is sent until the handlers are in place, so a Ctrl-C that comes after a worker holds the
 * command but before its pid is known is delivered, and forwarded, rather than killing us. */
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH};
static sigset_t saved_mask;
static int mask_saved = 0;

/* Run the command with the plain Python CLI: never returns. */
static void exec_python(int argc, char **argv)
{
    char **args = calloc((size_t)argc + 4, sizeof(char *));
    if (!args) {
        perror("gpuhpc");
        _exit(1);
    }
    if (mask_saved) /* what we blocked is delivered to the Python CLI, as if it had come now */
        sigprocmask(SIG_SETMASK, &saved_mask, NULL);
    args[0] = GPUHPC_PYTHON;
    args[1] = "-P"; /* no cwd on sys.path: a ./typer.py must not shadow anything */
    args[2] = "-m";
    args[3] = "gpuhpc";
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    execv(GPUHPC_PYTHON, args);
    fprintf(stderr, "gpuhpc: cannot run %s: %s\n", GPUHPC_PYTHON, strerror(errno));
    _exit(127);
}

/* The per-user socket directory: created 0700 if missing; refused unless it is a real
 * directory owned by us and closed to everyone else (a socket planted by someone else
 * would receive our environment and terminal). */
static int runtime_dir(char *buf, size_t size)
{
    const char *over = getenv("GPUHPC_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (over && *over)
        n = snprintf(buf, size, "%s", over);
    else if (xdg && *xdg)
        n = snprintf(buf, size, "%s/gpuhpc", xdg);
    else
        n = snprintf(buf, size, "/tmp/gpuhpc-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= size)
        return -1;
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(buf, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return -1;
    return 0;
}

/* No server: run the command with the Python CLI in a process that first starts a server
 * in the background if the config enables one. Never returns. */
static void exec_autostart(const char *sock, int argc, char **argv)
{
    char **args = calloc((size_t)argc + 6, sizeof(char *));
    if (!args)
        exec_python(argc, argv);
    args[0] = GPUHPC_PYTHON;
    args[1] = "-P";
    args[2] = "-m";
    args[3] = "gpuhpc.cmdserver";
    args[4] = "autostart";
    args[5] = (char *)sock;
    for (int i = 1; i < argc; i++)
        args[i + 5] = argv[i];
    execv(GPUHPC_PYTHON, args);
    exec_python(argc, argv);
}

static void forward(int sig)
{
    pid_t pid = worker_pid;
    if (pid > 0 && kill(-pid, sig) != 0)
        kill(pid, sig);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read one 5-byte message; 0 on success, -1 on EOF or error. */
static int read_msg(int fd, char *kind, int32_t *value)
{
    unsigned char b[5];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = read(fd, b + got, sizeof b - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    *kind = (char)b[0];
    *value = (int32_t)(((uint32_t)b[1] << 24) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 8) | b[4]);
    return 0;
}

/* Append s and its NUL to the request buffer. */
static int put(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*len + n > *cap) {
        size_t ncap = (*cap + n) * 2;
        char *nb = realloc(*buf, ncap);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = ncap;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    return 0;
}

static int cmp_gid(const void *a, const void *b)
{
    gid_t x = *(const gid_t *)a, y = *(const gid_t *)b;
    return (x > y) - (x < y);
}

/* The identity fields of the request: "RUID EUID RGID EGID", the sorted distinct
 * supplementary groups, "N SOFT0 HARD0 ..." for every resource limit. 0 on success. */
static int put_identity(char **buf, size_t *len, size_t *cap)
{
    char text[64 * RLIM_NLIMITS + 32];
    snprintf(text, sizeof text, "%u %u %u %u", (unsigned)getuid(), (unsigned)geteuid(), (unsigned)getgid(),
             (unsigned)getegid());
    if (put(buf, len, cap, text))
        return -1;

    int n = getgroups(0, NULL);
    if (n < 0)
        return -1;
    gid_t *groups = calloc((size_t)n + 1, sizeof(gid_t));
    char *list = calloc((size_t)n + 1, 12);
    if (!groups || !list || (n = getgroups(n, groups)) < 0) {
        free(groups);
        free(list);
        return -1;
    }
    qsort(groups, (size_t)n, sizeof(gid_t), cmp_gid);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && groups[i] == groups[i - 1])
            continue;
        at += (size_t)sprintf(list + at, at ? " %u" : "%u", (unsigned)groups[i]);
    }
    int bad = put(buf, len, cap, list);
    free(groups);
    free(list);
    if (bad)
        return -1;

    at = (size_t)snprintf(text, sizeof text, "%d", (int)RLIM_NLIMITS);
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        struct rlimit lim;
        if (getrlimit(r, &lim) != 0)
            return -1;
        long long soft = lim.rlim_cur == RLIM_INFINITY ? -1 : (long long)lim.rlim_cur;
        long long hard = lim.rlim_max == RLIM_INFINITY ? -1 : (long long)lim.rlim_max;
        at += (size_t)snprintf(text + at, sizeof text - at, " %lld %lld", soft, hard);
    }
    return put(buf, len, cap, text);
}

int main(int argc, char **argv)
{
    const char *mode = getenv("GPUHPC_CMDSERVER");
    if (mode && (!strcmp(mode, "off") || !strcmp(mode, "0") || !strcmp(mode, "no")))
        exec_python(argc, argv);
    int autostart = !(mode && !strcmp(mode, "noautostart"));
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        if (!strcmp(argv[i], "cmdserver"))
            exec_python(argc, argv); /* managing the server never goes through (or starts) it */
        break;
    }

    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (runtime_dir(dir, sizeof dir) != 0 ||
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s/cmd-%s.sock", dir, GPUHPC_SERVER_ID) >=
            (int)sizeof addr.sun_path)
        exec_python(argc, argv);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        exec_python(argc, argv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (autostart && (errno == ENOENT || errno == ECONNREFUSED))
            exec_autostart(addr.sun_path, argc, argv);
        exec_python(argc, argv);
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid())
        exec_python(argc, argv);

    /* the request */
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap), num[32];
    char cwd[8192];
    if (!buf || !getcwd(cwd, sizeof cwd))
        exec_python(argc, argv);
    mode_t mask = umask(022);
    umask(mask);
    int bad = put(&buf, &len, &cap, cwd);
    snprintf(num, sizeof num, "%o", (unsigned)mask);
    bad |= put(&buf, &len, &cap, num);
    bad |= put_identity(&buf, &len, &cap);
    snprintf(num, sizeof num, "%d", argc);
    bad |= put(&buf, &len, &cap, num);
    for (int i = 0; i < argc; i++)
        bad |= put(&buf, &len, &cap, argv[i]);
    for (char **e = environ; *e; e++)
        bad |= put(&buf, &len, &cap, *e);
    if (bad || len > 0x7fffffff)
        exec_python(argc, argv);

    unsigned char hdr[8] = {'G', 'P', 'H', '2', (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                            (unsigned char)(len >> 8), (unsigned char)len};
    int fds[3] = {0, 1, 2};
    char ctl[CMSG_SPACE(sizeof fds)];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaddset(&block, forwarded[i]);
    if (sigprocmask(SIG_BLOCK, &block, &saved_mask) == 0)
        mask_saved = 1;
    ssize_t sent;
    do
        sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof hdr || write_all(fd, buf, len) != 0)
        exec_python(argc, argv); /* nothing ran yet */
    free(buf);

    char kind;
    int32_t value;
    if (read_msg(fd, &kind, &value) != 0 || kind == 'F') {
        close(fd);
        exec_python(argc, argv); /* the server declined or died before starting the command */
    }
    if (kind != 'P') {
        fprintf(stderr, "gpuhpc: command server protocol error\n");
        return 1;
    }
    worker_pid = (pid_t)value;
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaction(forwarded[i], &sa, NULL);
    if (mask_saved) /* a signal that came meanwhile is forwarded now */
        sigprocmask(SIG_SETMASK, &saved_mask, NULL);
    if (read_msg(fd, &kind, &value) != 0 || kind != 'X') {
        fprintf(stderr, "gpuhpc: the command server worker (pid %d) ended without an exit code\n",
                (int)worker_pid);
        return 1;
    }
    return (int)value;
}
