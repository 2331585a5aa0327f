// Host-to-device copy rate of expert-sized pieces from different kinds
// of host memory, on the device machine (which has nvcc):
//   nvcc -O2 -o /tmp/copy_rate tools/device/copy_rate.cu
//   /tmp/copy_rate FILE [PIECE_BYTES] [COPIES]
// FILE: an expert file (layer_NN.bin); PIECE_BYTES: one expert's bytes
// (default: the file's size / 256). Each case queues COPIES copies of
// pieces at shuffled piece offsets on one stream into a device ring of 256
// MiB, and prints GB/s: pinned memory from cudaHostAlloc; the file
// mapped and registered read-only (as `backend/cuda/hostmap.rs` does);
// anonymous memory with and without transparent huge pages, registered.
// Then the same with two streams taking turns.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

// The device ring: RING_BYTES, in as many pieces as fit.
static const size_t RING_BYTES = 256u << 20;

static double rate(const char* host, size_t len, size_t piece, int copies, char* dev, int streams_n) {
    size_t n = len / piece;
    size_t ring = RING_BYTES / piece;
    std::vector<size_t> order(copies);
    unsigned s = 12345;
    for (int i = 0; i < copies; i++) {
        s = s * 1103515245u + 12345u;
        order[i] = (s >> 8) % n;
    }
    cudaStream_t st[2];
    for (int i = 0; i < streams_n; i++) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    // Warm: one pass of 16 copies.
    for (int i = 0; i < 16; i++)
        CK(cudaMemcpyAsync(dev + (i % ring) * piece, host + order[i] * piece, piece, cudaMemcpyHostToDevice, st[0]));
    CK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < copies; i++)
        CK(cudaMemcpyAsync(dev + (i % ring) * piece, host + order[i] * piece, piece, cudaMemcpyHostToDevice,
                           st[i % streams_n]));
    CK(cudaDeviceSynchronize());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < streams_n; i++) CK(cudaStreamDestroy(st[i]));
    return (double)piece * copies / secs / 1e9;
}

// The same copies in batches of `batch` (cudaMemcpyBatchAsync), one stream.
static double rate_batched(const char* host, size_t len, size_t piece, int copies, char* dev, int batch,
                           unsigned flags) {
    size_t n = len / piece;
    size_t ring = RING_BYTES / piece;
    std::vector<void*> dsts(copies);
    std::vector<const void*> srcs(copies);
    std::vector<size_t> sizes(copies, piece);
    unsigned s = 12345;
    for (int i = 0; i < copies; i++) {
        s = s * 1103515245u + 12345u;
        srcs[i] = host + ((s >> 8) % n) * piece;
        dsts[i] = dev + (i % ring) * piece;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = flags;
    size_t idx = 0;
    auto issue = [&](int i0, int cnt) {
#if CUDART_VERSION >= 13000
        CK(cudaMemcpyBatchAsync((void**)&dsts[i0], (const void**)&srcs[i0], &sizes[i0], cnt, &attr, &idx, 1, st));
#else
        size_t fail;
        CK(cudaMemcpyBatchAsync((void**)&dsts[i0], (void**)&srcs[i0], &sizes[i0], cnt, &attr, &idx, 1, &fail, st));
#endif
    };
    issue(0, 16);
    CK(cudaStreamSynchronize(st));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < copies; i += batch) issue(i, copies - i < batch ? copies - i : batch);
    CK(cudaStreamSynchronize(st));
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CK(cudaStreamDestroy(st));
    return (double)piece * copies / secs / 1e9;
}

static void report(const char* name, const char* host, size_t len, size_t piece, int copies, char* dev) {
    printf("%-34s 1 stream %6.2f GB/s   2 streams %6.2f GB/s\n", name, rate(host, len, piece, copies, dev, 1),
           rate(host, len, piece, copies, dev, 2));
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [PIECE_BYTES] [COPIES]\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct stat sb;
    fstat(fd, &sb);
    size_t len = sb.st_size;
    size_t piece = argc > 2 ? strtoull(argv[2], 0, 10) : 0;
    if (piece == 0) piece = len / 256;
    int copies = argc > 3 ? atoi(argv[3]) : 2000;
    printf("file %s: %zu bytes, pieces of %zu bytes, %d copies\n", argv[1], len, piece, copies);
    char* dev;
    CK(cudaMalloc(&dev, RING_BYTES));

    char* pinned;
    CK(cudaHostAlloc((void**)&pinned, len, cudaHostAllocPortable));
    if (pread(fd, pinned, len, 0) != (ssize_t)len) perror("pread");
    report("cudaHostAlloc", pinned, len, piece, copies, dev);
    report("cudaHostAlloc, pieces of 64 MiB", pinned, len, 64u << 20, 16, dev);
    CK(cudaFreeHost(pinned));

    void* map = mmap(0, len, PROT_READ, MAP_SHARED, fd, 0);
    CK(cudaHostRegister(map, len, cudaHostRegisterPortable | cudaHostRegisterReadOnly));
    report("file mapped, registered", (const char*)map, len, piece, copies, dev);
    for (int b : {8, 64})
        for (unsigned fl : {0u, (unsigned)cudaMemcpyFlagPreferOverlapWithCompute})
            printf("file mapped, registered, batches of %2d%s: %6.2f GB/s\n", b, fl ? ", overlap flag" : "",
                   rate_batched((const char*)map, len, piece, copies, dev, b, fl));
    CK(cudaHostUnregister(map));
    munmap(map, len);

    for (int huge = 0; huge < 2; huge++) {
        char* anon = (char*)mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(anon, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        if (pread(fd, anon, len, 0) != (ssize_t)len) perror("pread");
        CK(cudaHostRegister(anon, len, cudaHostRegisterPortable));
        report(huge ? "anonymous, huge pages, registered" : "anonymous, 4 KiB pages, registered", anon, len, piece,
               copies, dev);
        CK(cudaHostUnregister(anon));
        munmap(anon, len);
    }
    char buf[256];
    FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && fgets(buf, sizeof buf, f)) printf("transparent huge pages: %s", buf);
    return 0;
}
