import ArgumentParser
import FetchQ

/// `fetchq`: the command-line front end of the engine (see docs/cli.md).
@main
struct FetchQCLI: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fetchq",
        abstract: "Fetch and parse many URLs at once on a fetchq operation queue.",
        discussion: """
            Results are JSON lines on stdout; errors go to stderr. A progress bar \
            (operations done/total, bytes, rate) is drawn on stderr when it is a terminal. \
            Ctrl-C cancels every operation and waits for each to end.

            Exit status: 0 every operation succeeded; 1 at least one failed, or the results \
            could not be written; 2 usage error (including an option value the engine \
            rejects); 130 interrupted by Ctrl-C; 141 stdout's reader went away (SIGPIPE).

            Examples (test server: python3 Tests/support/testserver.py --port 8000):
              fetchq search --results /results --sort /created_at --merged \\
                  --url 'http://127.0.0.1:8000/search?q={query}&rpp=500' swift rust
              fetchq get 'http://127.0.0.1:8000/json?size=100' http://127.0.0.1:8000/
              fetchq request -X POST -H 'Content-Type: text/plain' --data 'hello' \\
                  http://127.0.0.1:8000/echo
            """,
        version: fetchqVersionString,
        subcommands: [Search.self, Get.self, Request.self])

    /// `fetchq` alone: a missing argument, exit 2 with the usage on stderr
    /// (swift-argument-parser printed the help on stdout and exited 0: the
    /// tenth review). `fetchq --help` still prints it and exits 0.
    func run() throws {
        throw ValidationError("a subcommand is required: search, get or request")
    }

    /// ArgumentParser's `main`, except that usage errors exit with status 2
    /// (its default is EX_USAGE, 64), and one found by a subcommand's `run`
    /// shows that subcommand's usage, as one found while parsing does.
    static func main() {
        Startup.prepare()
        var command: ParsableCommand
        do {
            command = try parseAsRoot(nil)
        } catch {
            exit(after: error, in: nil)
        }
        do {
            try command.run()
        } catch {
            exit(after: error, in: type(of: command))
        }
    }

    private static func exit(after error: Error, in subcommand: ParsableCommand.Type?) -> Never {
        guard exitCode(for: error) == .validationFailure else { exit(withError: error) }
        var stderr = StandardError()
        if let subcommand, subcommand != FetchQCLI.self, let error = error as? ValidationError {
            let name = subcommand.configuration.commandName ?? String(describing: subcommand).lowercased()
            print("Error: \(error.message)\nUsage: \(usageString(for: subcommand))\n"
                  + "  See 'fetchq \(name) --help' for more information.", to: &stderr)
        } else {
            print(fullMessage(for: error), to: &stderr)
        }
        exit(withError: ExitCode(2))
    }
}

/// `print(..., to:)` target for stderr.
struct StandardError: TextOutputStream {
    mutating func write(_ string: String) { writeAll(2, Array(string.utf8)) }
}
