/* floor-c: perf/bench_broker.py's compiled floor of a sync call. floor-raw's work
 * (a thread per connection, blocking recv; per complete call frame: the message type,
 * the method name and the seqid, and the canned reply of that method with the call's
 * seqid copied in) without Python: what a call costs a server with no interpreter at
 * all, the kernel's part (wake-ups, recv, send) and little else.
 *
 * Usage: floor_c PORT REPLIES_FILE
 * REPLIES_FILE: records of (u32 name length, name, u32 head length, head, u32 tail length,
 * tail), big-endian lengths; a call of a method without a record gets `unknown` (the
 * record named "") . Oneway calls get no reply (the floor's workloads here are sync).
 * Built by bench_broker.py with `cc -O2 -pthread`. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_REPLIES 16
#define BUF_BYTES (1 << 20)

struct reply {
    char name[64];
    uint32_t name_len;
    unsigned char *head, *tail;
    uint32_t head_len, tail_len;
};

static struct reply replies[MAX_REPLIES];
static int n_replies;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static unsigned char *read_part(FILE *f, uint32_t *len) {
    unsigned char b[4];
    if (fread(b, 1, 4, f) != 4) return NULL;
    *len = be32(b);
    unsigned char *p = malloc(*len + 1);
    if (!p || fread(p, 1, *len, f) != *len) exit(2);
    return p;
}

static void load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    uint32_t len;
    unsigned char *name;
    while (n_replies < MAX_REPLIES && (name = read_part(f, &len)) != NULL) {
        struct reply *r = &replies[n_replies++];
        if (len >= sizeof r->name) exit(2);
        memcpy(r->name, name, len);
        r->name_len = len;
        free(name);
        r->head = read_part(f, &r->head_len);
        r->tail = read_part(f, &r->tail_len);
        if (!r->head || !r->tail) exit(2);
    }
    fclose(f);
}

static const struct reply *find(const unsigned char *name, uint32_t len) {
    const struct reply *unknown = NULL;
    for (int i = 0; i < n_replies; i++) {
        if (replies[i].name_len == len && memcmp(replies[i].name, name, len) == 0) return &replies[i];
        if (replies[i].name_len == 0) unknown = &replies[i];
    }
    return unknown;
}

static int send_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *serve(void *arg) {
    int fd = (int)(intptr_t)arg;
    unsigned char *buf = malloc(BUF_BYTES), *out = malloc(BUF_BYTES);
    size_t end = 0;
    if (!buf || !out) exit(2);
    for (;;) {
        ssize_t n = recv(fd, buf + end, BUF_BYTES - end, 0);
        if (n <= 0) break;
        end += (size_t)n;
        size_t pos = 0, o = 0;
        while (end - pos >= 12) {
            uint32_t size = be32(buf + pos);
            if (size + 4 > BUF_BYTES) goto done;
            if (end - pos - 4 < size) break;
            if (buf[pos + 7] != 4) { /* not oneway: answer */
                uint32_t name_len = be32(buf + pos + 8);
                size_t at = pos + 12 + name_len;
                const struct reply *r = find(buf + pos + 12, name_len);
                if (!r || at + 4 > pos + 4 + size) goto done;
                if (o + r->head_len + 4 + r->tail_len > BUF_BYTES) {
                    if (send_all(fd, out, o)) goto done;
                    o = 0;
                }
                memcpy(out + o, r->head, r->head_len);
                memcpy(out + o + r->head_len, buf + at, 4);
                memcpy(out + o + r->head_len + 4, r->tail, r->tail_len);
                o += r->head_len + 4 + r->tail_len;
            }
            pos += 4 + size;
        }
        if (o && send_all(fd, out, o)) break;
        memmove(buf, buf + pos, end - pos);
        end -= pos;
    }
done:
    close(fd);
    free(buf);
    free(out);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: floor_c PORT REPLIES_FILE\n"); return 2; }
    load(argv[2]);
    unlink(argv[2]); /* written for this process only */
    int srv = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(srv, (struct sockaddr *)&a, sizeof a) || listen(srv, 128)) { perror("bind/listen"); return 2; }
    for (;;) {
        int fd = accept(srv, NULL, NULL);
        if (fd < 0) continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        if (pthread_create(&t, &attr, serve, (void *)(intptr_t)fd)) close(fd);
        pthread_attr_destroy(&attr);
    }
}
