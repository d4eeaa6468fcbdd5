import type { OrderCreated, OrderLine } from "../shared/events";

const lineTotal = (line: OrderLine): number => line.quantity * line.unit_price;

export function orderTotal(order: OrderCreated): number {
  return order.lines.reduce((sum, line) => sum + lineTotal(line), 0);
}

export function confirmationMessage(order: OrderCreated): string {
  const total = orderTotal(order).toFixed(2);
  return `Order ${order.order_id} confirmed for ${order.customer.email}: ${order.lines.length} item(s), total ${total}`;
}
