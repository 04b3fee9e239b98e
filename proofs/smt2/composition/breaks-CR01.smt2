; placement-logic proof obligation: composition/breaks-CR01
; theorem: Composition
; breaking CR01 axis-one-role is refuted
;   statement refuted: Each mesh axis is used by one strategy role (or by one explicitly nested multi-axis strategy).  [plan: megatron_tp also bound to x, which ddp already uses]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x0 (>= size_x 2)))
(let (($x1 (and $x0 true)))
(or $x1))))
(check-sat)
(exit)
