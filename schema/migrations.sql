-- 模式版本账本与迁移锁（由 `receiver init` 与 `receiver migrate` 创建）。
-- 数据只在 schema.sql 的两张表里；这两张表只记录模式本身：当前是第几版、每一步何时开始何时完成、
-- 此刻谁在迁移。两条语句都带 IF NOT EXISTS：两个 migrate 同时首次运行时，各建一次也无妨。
-- DBA 一条语句即可读出当前版本：
--   SELECT MAX(version) FROM receiver_schema_versions WHERE state <> 'started';

CREATE TABLE IF NOT EXISTS receiver_schema_versions (
    version    INT UNSIGNED   NOT NULL COMMENT '模式版本号；每个版本恰好对应一条 DDL 语句（第 1 版为初始两张表）',
    name       VARBINARY(64)  NOT NULL COMMENT '这一步的名称，如 inbox-received-at-index',
    state      VARBINARY(16)  NOT NULL COMMENT 'started：语句执行前记下；applied：语句完成后记下；recognised：按表的实际结构认定（记录版本之前建的库）',
    statement  TEXT           NOT NULL COMMENT '这一步执行的 DDL 原文（初始版本与按结构认定的版本为说明文字）',
    started_at DATETIME(6)    NOT NULL COMMENT '开始时间（UTC，微秒）',
    applied_at DATETIME(6)    NULL     COMMENT '完成时间（UTC，微秒）；未完成时为 NULL',
    applied_by VARBINARY(255) NOT NULL COMMENT '执行者：程序、版本、主机与进程号，如 receiver 0.2.0 migrate on host pid 42',
    PRIMARY KEY (version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
  COMMENT = '接收方模式版本账本：每一步迁移开始前与完成后各记一次，中断的一步有名有姓';

CREATE TABLE IF NOT EXISTS receiver_schema_lock (
    id         TINYINT UNSIGNED NOT NULL COMMENT '恒为 1：全库只有这一把锁',
    holder     VARBINARY(255)   NULL     COMMENT '持锁的 migrate（程序、版本、主机与进程号）；NULL 为空闲',
    taken_at   DATETIME(6)      NULL     COMMENT '取得锁的时间（UTC，微秒）',
    renewed_at DATETIME(6)      NULL     COMMENT '最近一次续约（UTC，微秒）；超过租期未续约的锁可被接管',
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
  COMMENT = '接收方迁移锁：一行，比较并交换，Galera 上同样成立（不用 GET_LOCK）';
