<?php
// What PHP Hermes 4.x does with a message whose envelope carries "headers".
//
//   php headers_check.php HERMES_SRC KEY < body.json
//
// HERMES_SRC is tomaj/hermes's src/ directory (a checkout: there is no
// composer here, so its three small dependencies are stubbed below; none of
// them touches a message). KEY is a fresh Redis set name on 127.0.0.1:6379.
// It prints one JSON line per step:
//   "seen":       a PHP worker took `body` from the set; its handler prints
//                 what PHP's Message gave it, then fails so PHP retries it;
//   "handled":    the retry copy PHP wrote to KEY_schedule, as PHP wrote it;
//   "serialized": PHP's MessageSerializer on fixed messages, for byte checks.
// (A PHP worker never moves due messages out of the schedule -- see the
// README -- so what a PHP move would write is not asked.)
declare(strict_types=1);

namespace Ramsey\Uuid {
    final class Uuid
    {
        public static function uuid4(): self
        {
            return new self();
        }

        public function toString(): string
        {
            $b = random_bytes(16);
            $b[6] = chr(ord($b[6]) & 0x0f | 0x40);
            $b[8] = chr(ord($b[8]) & 0x3f | 0x80);
            return vsprintf('%s%s-%s-%s-%s-%s%s%s', str_split(bin2hex($b), 4));
        }
    }
}

namespace Psr\Log {
    interface LoggerInterface
    {
        public function log($level, $message, array $context = []);
    }

    final class LogLevel
    {
        const EMERGENCY = 'emergency';
        const ALERT = 'alert';
        const CRITICAL = 'critical';
        const ERROR = 'error';
        const WARNING = 'warning';
        const NOTICE = 'notice';
        const INFO = 'info';
        const DEBUG = 'debug';
    }
}

namespace Tracy {
    final class Debugger
    {
        const EXCEPTION = 'exception';

        public static function isEnabled(): bool
        {
            return false;
        }

        public static function log($value, string $level): void
        {
        }
    }
}

namespace {
    use Tomaj\Hermes\Dispatcher;
    use Tomaj\Hermes\Driver\RedisSetDriver;
    use Tomaj\Hermes\Handler\HandlerInterface;
    use Tomaj\Hermes\Handler\RetryTrait;
    use Tomaj\Hermes\Message;
    use Tomaj\Hermes\MessageInterface;
    use Tomaj\Hermes\MessageSerializer;

    [$script, $src, $key] = $argv;
    spl_autoload_register(function (string $class) use ($src): void {
        $prefix = 'Tomaj\\Hermes\\';
        if (strncmp($class, $prefix, strlen($prefix)) === 0) {
            require $src . '/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
        }
    });

    final class FailingHandler implements HandlerInterface
    {
        use RetryTrait;

        public function handle(MessageInterface $message): bool
        {
            echo json_encode(['seen' => [
                'id' => $message->getId(),
                'type' => $message->getType(),
                'payload' => $message->getPayload(),
                'retries' => $message->getRetries(),
                'methods' => get_class_methods($message),
            ]]), "\n";
            throw new RuntimeException('fail once, to make PHP write a retry copy');
        }
    }

    function worker(Redis $redis, string $key): void
    {
        $driver = new RedisSetDriver($redis, $key, 1, "{$key}_schedule");
        $driver->setMaxProcessItems(1);
        $dispatcher = new Dispatcher($driver);
        $dispatcher->registerHandler('headers-check', new FailingHandler());
        $dispatcher->handle();
    }

    $body = stream_get_contents(STDIN);
    $redis = new Redis();
    $redis->connect('127.0.0.1', 6379);

    $redis->sAdd($key, $body);
    worker($redis, $key);
    echo json_encode(['handled' => $redis->zRange("{$key}_schedule", 0, -1)]), "\n";
    $redis->del($key, "{$key}_schedule");

    $serializer = new MessageSerializer();
    echo json_encode(['serialized' => [
        $serializer->serialize(new Message(
            'mail', ['to' => 'a@example.com', 'n' => 3], '0f8fad5b-d9cb-469f-a165-70867728950e',
            1764480002.25, null, 0
        )),
        $serializer->serialize(new Message(
            'later', ['nested' => ['x' => [1, 2]]], '7c9e6679-7425-40de-944b-e07fc1f90ae7',
            1764480002.5, 1764480016.75, 3
        )),
        $serializer->serialize(new Message(
            'no-payload', null, 'e4eaaaf2-d142-11e1-b3e4-080027620cdd', 1764480003.125, null, 0
        )),
    ]]), "\n";
}
