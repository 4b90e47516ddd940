import CFetchQSupport
import CJansson
import Glibc
import Synchronization
import Testing

@testable import FetchQ

/// jansson's allocation functions with a per-thread cache of freed blocks
/// (Sources/CFetchQSupport/jansson_cache.c). Only threads that turn it on
/// (the engine's) keep blocks: each test turns it on for its own thread and
/// off again at the end, so what it counts is its own.
/// (A block freed again soon after stops the process: the C harness checks
/// that in a child, `jansson_cache_double_free_stops_the_process`.)
/// Serialized: one test sets another allocator for a moment.
@Suite(.serialized) struct JanssonCacheTests {
    static let maxClassBytes = Int(FQS_JC_CLASSES) * 16 + 8
    /// The room a thread takes from the process's budget at a time.
    static let grant = 256 * 1024

    /// Installed for the test, then put back as it was: the sanitizer runs
    /// set FETCHQ_JANSSON_CACHE=0 for everything else (docs/reliability.md).
    func withCache(_ body: () throws -> Void) rethrows {
        let was = fqs_jansson_cache_installed() == 1
        json_set_alloc_funcs(malloc, free)
        #expect(fqs_jansson_cache_install() == 1)
        fqs_jansson_cache_thread_enable(1)
        fqs_jansson_cache_drain_thread()
        defer {
            fqs_jansson_cache_thread_enable(0)
            if !was { json_set_alloc_funcs(malloc, free) }
        }
        try body()
    }

    @Test func anEngineInstallsItOverMallocAndFreeUnlessTurnedOff() throws {
        let was = fqs_jansson_cache_installed() == 1
        defer { if was { json_set_alloc_funcs(fqs_jc_malloc, fqs_jc_free) } else { json_set_alloc_funcs(malloc, free) } }
        json_set_alloc_funcs(malloc, free)
        let wanted = fqs_jansson_cache_wanted(getenv("FETCHQ_JANSSON_CACHE")) == 1
        let engine = try Engine(config: EngineConfig())
        defer { _ = engine.shutdown() }
        #expect(fqs_jansson_cache_installed() == (wanted ? 1 : 0))
        guard wanted else { return }
        // jansson values are made and freed through it: a thread that does
        // not keep blocks (this one, as any of the application's) frees them
        json_decref(json_string("a string value of some length")!)
        #expect(fqs_jansson_cache_thread_bytes() == 0)
        // one that does (as the engine's threads) keeps them
        fqs_jansson_cache_thread_enable(1)
        defer { fqs_jansson_cache_thread_enable(0) }
        json_decref(json_string("a string value of some length")!)
        #expect(fqs_jansson_cache_thread_bytes() > 0)
        fqs_jansson_cache_thread_enable(0)
        #expect(fqs_jansson_cache_thread_bytes() == 0)
    }

    /// The engine's threads keep blocks; a block kept on the worker that ran
    /// a body is handed out again there.
    @Test func theEnginesThreadsKeepBlocks() throws {
        try withCache {
            let engine = try Engine(config: EngineConfig())
            defer { _ = engine.shutdown() }
            let queue = try engine.makeQueue(name: "jc", maxConcurrent: 1)
            let kept = Mutex<[Int]>([])
            for _ in 0..<2 {
                let id = try engine.submit(.block { _ in
                    fqs_jansson_cache_drain_thread()
                    json_decref(json_string("a string value of some length"))
                    kept.withLock { $0.append(fqs_jansson_cache_thread_bytes()) }
                    return nil
                }, to: queue, options: nil, completion: nil)
                #expect(id > 0)
            }
            #expect(engine.waitIdle(timeoutMs: 10_000) == .ok)
            #expect(kept.withLock { $0.count } == 2)
            #expect(kept.withLock { $0.allSatisfy { $0 > 0 } })
        }
    }

    @Test func theEnvironmentVariableTurnsItOff() {
        #expect(fqs_jansson_cache_wanted(nil) == 1)
        #expect(fqs_jansson_cache_wanted("1") == 1)
        #expect(fqs_jansson_cache_wanted("yes") == 1)
        #expect(fqs_jansson_cache_wanted("0") == 0)
    }

    @Test func aFreedBlockServesTheNextRequestOfItsClass() {
        withCache {
            let p = fqs_jc_malloc(40)!
            #expect(fqs_usable_size(p) >= 40)
            fqs_jc_free(p)
            #expect(fqs_jansson_cache_thread_bytes() == 40)  // class 2: 40 usable bytes
            let q = fqs_jc_malloc(25)!  // 25...40 bytes: class 2
            #expect(q == p)
            #expect(fqs_jansson_cache_thread_bytes() == 0)
            let r = fqs_jc_malloc(24)!  // class 1: not the same block
            #expect(r != p)
            fqs_jc_free(q)
            fqs_jc_free(r)
            #expect(fqs_jansson_cache_thread_bytes() == 40 + 24)
            fqs_jansson_cache_drain_thread()
            #expect(fqs_jansson_cache_thread_bytes() == 0)
        }
    }

    /// Every size up to past the largest class, in a mixed order of frees and
    /// requests: each block handed out has room for what was asked (the
    /// sanitizer runs would also catch a write past its end).
    @Test func everyBlockHoldsWhatWasAsked() {
        withCache {
            var held: [UnsafeMutableRawPointer] = []
            for round in 0..<3 {
                for n in 1...(Self.maxClassBytes + 40) {
                    let size = (n * 7 + round * 13) % (Self.maxClassBytes + 40) + 1
                    let p = fqs_jc_malloc(size)!
                    #expect(fqs_usable_size(p) >= size)
                    memset(p, Int32(size & 0xFF), size)
                    held.append(p)
                }
                // free every other one: the rest are served from the lists
                for (i, p) in held.enumerated() where i % 2 == round % 2 { fqs_jc_free(p) }
                held = held.enumerated().filter { $0.offset % 2 != round % 2 }.map(\.element)
            }
            for p in held { fqs_jc_free(p) }
            #expect(fqs_jansson_cache_thread_bytes() <= Int(FQS_JC_MAX_BYTES))
            fqs_jansson_cache_drain_thread()
        }
    }

    @Test func largerBlocksAreNotKept() {
        withCache {
            // (far past the largest class: allocators round usable sizes up,
            // ThreadSanitizer's by more than glibc)
            let p = fqs_jc_malloc(Self.maxClassBytes * 4)!
            #expect(fqs_usable_size(p) >= Self.maxClassBytes * 4)
            fqs_jc_free(p)
            #expect(fqs_jansson_cache_thread_bytes() == 0)
            // A plain malloc block is kept in the class its usable size allows
            // (under ASan or valgrind the usable size is what was asked), and a
            // block from the lists may go back to free().
            let small = malloc(30)!
            let usable = fqs_usable_size(small)
            fqs_jc_free(small)
            #expect(fqs_jansson_cache_thread_bytes() == (usable - 8) / 16 * 16 + 8)
            let again = fqs_jc_malloc((usable - 8) / 16 * 16 + 8)!
            #expect(again == small)
            free(again)
            #expect(fqs_jansson_cache_thread_bytes() == 0)
        }
    }

    @Test func aThreadKeepsAtMostTheBound() {
        withCache {
            let count = Int(FQS_JC_MAX_BYTES) / 40 + 100
            var blocks: [UnsafeMutableRawPointer] = []
            blocks.reserveCapacity(count)
            for _ in 0..<count { blocks.append(fqs_jc_malloc(40)!) }
            for p in blocks { fqs_jc_free(p) }
            // Kept up to the room this thread holds, which is at most the
            // per-thread bound. (Other tests' engine threads in this process
            // hold room too, so whether it reached 4 MiB depends on them; the
            // C harness checks both bounds exactly, each in a process of its
            // own: jansson_cache_bounded_per_thread, _across_threads.)
            let kept = fqs_jansson_cache_thread_bytes()
            let granted = fqs_jansson_cache_thread_granted()
            #expect(granted <= Int(FQS_JC_MAX_BYTES))
            #expect(kept <= granted)
            #expect(kept > granted - 40)
            #expect(granted >= Self.grant)
            #expect(fqs_jansson_cache_granted_bytes() <= Int(FQS_JC_PROCESS_MAX_BYTES))
            fqs_jansson_cache_drain_thread()
            #expect(fqs_jansson_cache_thread_bytes() == 0)
            #expect(fqs_jansson_cache_thread_granted() == 0)
        }
    }

    /// The room for a thread's lists comes in grants of 256 KiB and goes
    /// back when the lists shrink two grants below it: a thread that kept
    /// blocks for a burst does not hold the process's budget afterwards.
    @Test func aThreadGivesRoomBackWhenItsListsShrink() {
        withCache {
            #expect(fqs_jansson_cache_thread_granted() == 0)
            let count = 3 * Self.grant / 40  // 768 KiB of 40-byte blocks
            var blocks: [UnsafeMutableRawPointer] = []
            blocks.reserveCapacity(count)
            for _ in 0..<count { blocks.append(fqs_jc_malloc(40)!) }
            #expect(fqs_jansson_cache_thread_granted() == 0)  // nothing freed yet
            for p in blocks { fqs_jc_free(p) }
            let kept = fqs_jansson_cache_thread_bytes()
            let granted = fqs_jansson_cache_thread_granted()
            // all kept, in whole grants (unless the process's budget ran out)
            #expect(granted % Self.grant == 0)
            #expect(kept <= granted && kept > granted - Self.grant)
            // Handed out again (most of them: glibc may have given a larger
            // block for some requests, kept in the next class), the room goes
            // back down to less than two grants above what is kept.
            blocks.removeAll(keepingCapacity: true)
            for _ in 0..<(kept / 40) { blocks.append(fqs_jc_malloc(40)!) }
            let left = fqs_jansson_cache_thread_bytes()
            #expect(left < kept / 10)
            #expect(fqs_jansson_cache_thread_granted() < granted)
            #expect(fqs_jansson_cache_thread_granted() - left < 2 * Self.grant)
            for p in blocks { free(p) }
        }
    }

    @Test func aThreadsBlocksAreFreedWhenItExits() throws {
        try withCache {
            let before = fqs_jansson_cache_exit_drained_bytes()
            var thread = pthread_t()
            let rc = pthread_create(&thread, nil, { _ in
                // 100 blocks kept by this thread; each counts as its class's
                // size (its usable size depends on the allocator: ASan, TSan)
                fqs_jansson_cache_thread_enable(1)
                var blocks: [UnsafeMutableRawPointer] = []
                for _ in 0..<100 { blocks.append(fqs_jc_malloc(70)!) }
                let expected = blocks.reduce(0) { $0 + (fqs_usable_size($1) - 8) / 16 * 16 + 8 }
                for p in blocks { fqs_jc_free(p) }
                let kept = fqs_jansson_cache_thread_bytes()
                return UnsafeMutableRawPointer(bitPattern: kept == expected ? kept : 0)
            }, nil)
            try #require(rc == 0)
            var kept: UnsafeMutableRawPointer? = nil
            pthread_join(thread, &kept)
            let bytes = Int(bitPattern: kept)
            #expect(bytes >= 100 * 72)  // 0 if the thread counted otherwise
            // Other tests' threads may exit meanwhile and add theirs.
            #expect(fqs_jansson_cache_exit_drained_bytes() - before >= bytes)
        }
    }

    /// Another allocator set before fetchq is left in place.
    @Test func anotherAllocatorIsLeftAlone() {
        withCache {
            // Functions that are malloc and free under other names: the test
            // may run while other tests make jansson values, which these serve.
            json_set_alloc_funcs({ n in malloc(n) }, { p in free(p) })
            #expect(fqs_jansson_cache_install() == 0)
            #expect(fqs_jansson_cache_installed() == 0)
            var m: json_malloc_t? = nil
            var f: json_free_t? = nil
            json_get_alloc_funcs(&m, &f)
            #expect(m != nil && f != nil)
            json_set_alloc_funcs(malloc, free)
            #expect(fqs_jansson_cache_install() == 1)
            #expect(fqs_jansson_cache_installed() == 1)
        }
    }
}
