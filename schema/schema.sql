-- 接收方结果 Inbox 的初始 DDL（第 1 版）。
-- 由 `receiver init` 原样执行；已有表时 init 报错退出，不修复、不覆盖。
-- 两张表共 17 列，无外键，无级联删除，无 JSON 列类型（JSON 类型会改写数字与键序）。
-- 身份列使用 VARBINARY，按字节比较：默认排序规则不区分大小写和重音，会让不同的 ID 在唯一键上相撞。
-- 时间列均为 UTC：连接会话的 time_zone 固定为 '+00:00'，取值来自 UTC_TIMESTAMP(6)。

CREATE TABLE receiver_inbox (
    consumer_name   VARBINARY(64)   NOT NULL COMMENT '消费者名称：固定的接收用途（RECEIVER_NAME），按字节比较',
    queue_id        VARBINARY(128)  NOT NULL COMMENT '来源队列 ID，必须与配置的队列一致，按字节比较',
    event_id        VARBINARY(128)  NOT NULL COMMENT '平台事件 ID；与消费者名称、队列共同构成去重身份，按字节比较',
    event_digest    BINARY(32)      NOT NULL COMMENT '规范化事件字节的 SHA-256 摘要（规范形式第 1 版），用于识别同 ID 不同内容',
    event_canonical MEDIUMBLOB      NOT NULL COMMENT '冻结的规范化事件 JSON 原始字节，即交付时的事件快照，绝不按任务查询重建',
    applied         TINYINT(1)      NOT NULL COMMENT '本事件是否推进了任务结果视图：1 为推进，0 为旧版本仅留历史',
    received_at     DATETIME(6)     NOT NULL COMMENT '受理时间（UTC，微秒），与视图更新同一事务提交',
    PRIMARY KEY (consumer_name, queue_id, event_id),
    KEY receiver_inbox_received_at (consumer_name, queue_id, received_at)
        COMMENT '按受理时间找出窗口之外的旧行（receiver prune）与最早一行的年龄，不必扫描全表'
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
  COMMENT = '接收方事件收件箱：按消费者名称、队列和事件 ID 去重，保存冻结事件及其摘要';

CREATE TABLE receiver_task_views (
    consumer_name  VARBINARY(64)  NOT NULL COMMENT '消费者名称：固定的接收用途（RECEIVER_NAME），按字节比较',
    queue_id       VARBINARY(128) NOT NULL COMMENT '来源队列 ID，按字节比较',
    task_id        VARBINARY(128) NOT NULL COMMENT '平台任务 ID；与消费者名称、队列共同构成视图身份，按字节比较',
    task_version   BIGINT UNSIGNED NOT NULL COMMENT '已应用的最高任务版本（≥ 1）；只有更高版本才能推进；任务的首个事件直接以最终值建立视图行，任何时刻都没有占位版本',
    last_event_id  VARBINARY(128) NOT NULL COMMENT '推进视图的最后一个事件 ID；同版本不同事件 ID 视为冲突',
    last_state     VARBINARY(32)  NOT NULL COMMENT '最后状态，如 CANCELLED、SUCCEEDED、NEEDS_REVIEW（待核查，绝不转译为成功）',
    last_result    MEDIUMBLOB     NULL     COMMENT '最后结果的规范化 JSON 原始字节；事件未携带结果时为 SQL NULL',
    applied_events BIGINT UNSIGNED NOT NULL COMMENT '视图实际推进的次数；重复事件和旧版本事件不计入',
    created_at     DATETIME(6)    NOT NULL COMMENT '视图首次建立时间（UTC，微秒）',
    updated_at     DATETIME(6)    NOT NULL COMMENT '视图最后推进时间（UTC，微秒）',
    PRIMARY KEY (consumer_name, queue_id, task_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
  COMMENT = '接收方任务结果只读视图：按任务版本单调前进，不是平台的权威任务状态';
